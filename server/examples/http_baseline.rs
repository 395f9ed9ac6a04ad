//! An axum hello world on one current-thread runtime per core with SO_REUSEPORT, like the
//! server's workers: the baseline `server/bench.sh` compares `POST /v1/check` with.
//! Usage: `http_baseline ADDR WORKERS`.

use axum::routing::post;
use axum::Router;

// The allocator of the turnstile binary (cli/src/main.rs): the comparison is of the servers,
// not of their allocators.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut a = std::env::args().skip(1);
    let addr: std::net::SocketAddr = a
        .next()
        .unwrap_or("127.0.0.1:8090".into())
        .parse()
        .expect("ADDR");
    let workers: usize = a.next().map_or(1, |w| w.parse().expect("WORKERS"));
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            std::thread::spawn(move || {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                s.set_reuse_port(true).unwrap();
                s.set_nonblocking(true).unwrap();
                s.bind(&addr.into()).unwrap();
                s.listen(1024).unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let l = tokio::net::TcpListener::from_std(s.into()).unwrap();
                    let app = Router::new().route("/", post(|| async { "hello" }));
                    axum::serve(l, app).await.unwrap();
                });
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}
