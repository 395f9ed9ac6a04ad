//! The `turnstile` command: `demo`, `bench`, `memory`, `accuracy`, `rules check`.

use mimalloc::MiMalloc;

// mimalloc: the bench's per-thread allocations and the memory report's large tables; its
// effect on the bench is measured in docs/performance.md.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

mod cli;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match cli::run(args) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("turnstile: {e}");
            std::process::exit(2);
        }
    }
}
