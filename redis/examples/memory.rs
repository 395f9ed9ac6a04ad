//! `cargo run --release -p turnstile-redis --example memory -- redis://127.0.0.1:PORT [USERS]`:
//! Redis bytes per user per algorithm (flushes the database; docs/redis.md).

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let users = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    match turnstile_redis::memory::measure(&url, users).await {
        Ok(rows) => {
            println!("| algorithm (500/h) | each user | users | used_memory per user | MEMORY USAGE of one user | encoding | in memory (accounted) |");
            println!("|---|---|---|---|---|---|---|");
            for r in rows {
                println!(
                    "| {} | {} | {} | {:.0} B | {} B | {} | {:.1} B |",
                    r.name,
                    r.fill,
                    r.users,
                    r.bytes_per_user,
                    r.memory_usage,
                    r.encoding,
                    r.in_memory_bytes_per_user
                );
            }
        }
        Err(e) => {
            eprintln!("memory: {e}");
            std::process::exit(1);
        }
    }
}
