//! `cargo run --release -p turnstile-redis --example bench -- redis://127.0.0.1:PORT [REQUESTS]`:
//! checks/s per algorithm beside INCR, at concurrency 1 and 64 (docs/redis.md).

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let requests = args.next().and_then(|n| n.parse().ok()).unwrap_or(50_000);
    match turnstile_redis::bench::run(&url, requests, &[1, 64]).await {
        Ok(rows) => {
            println!("| engine | concurrency | calls/s | vs INCR |");
            println!("|---|---|---|---|");
            let mut incr = 1.0;
            for r in rows {
                if r.name == "INCR" {
                    incr = r.per_sec;
                }
                println!(
                    "| {} | {} | {:.0} | {:.0} % |",
                    r.name,
                    r.concurrency,
                    r.per_sec,
                    100.0 * r.per_sec / incr
                );
            }
        }
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::exit(1);
        }
    }
}
