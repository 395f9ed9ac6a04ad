//! Gives the binary the commit it was built from (`turnstile --version`): `git rev-parse` of
//! the checkout it is built in, `TURNSTILE_COMMIT` when set (a packager's build from a source
//! archive), or `unknown` (no git, no checkout).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=TURNSTILE_COMMIT");
    let commit = std::env::var("TURNSTILE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    // Built again when HEAD moves: HEAD itself (a checkout), the packed refs, and the branch
    // HEAD names (a commit) — its loose ref, or the folder it will appear in. Not every
    // branch: a commit elsewhere would rebuild this crate. Only paths that exist: a missing
    // one would rebuild it every time.
    let path_of = |p: &str| git(&["rev-parse", "--path-format=absolute", "--git-path", p]);
    let mut watch: Vec<String> = ["HEAD", "packed-refs"]
        .iter()
        .filter_map(|p| path_of(p))
        .collect();
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]).and_then(|b| path_of(&b)) {
        let path = std::path::Path::new(&branch);
        watch.push(if path.exists() {
            branch.clone()
        } else {
            path.parent()
                .map_or(branch.clone(), |d| d.display().to_string())
        });
    }
    for p in watch.iter().filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={p}");
    }
    println!(
        "cargo:rustc-env=TURNSTILE_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    // The target and the CPU features the build assumes (`.cargo/config.toml` asks for
    // cmpxchg16b and AVX on x86-64): what the binary needs of the machine it runs on.
    let target = std::env::var("TARGET").unwrap_or_default();
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let cpu: Vec<&str> = ["cmpxchg16b", "avx", "avx2", "sse4.1"]
        .into_iter()
        .filter(|f| features.split(',').any(|g| g == *f))
        .collect();
    println!(
        "cargo:rustc-env=TURNSTILE_TARGET={target} ({})",
        cpu.join(" ")
    );
    // What is compiled in: fixed by this crate's dependencies (Cargo.toml), but io_uring,
    // which is Linux's.
    let mut compiled = vec![
        "rules",
        "coarse-clock",
        "redis (Redis and Redis Cluster backend)",
        "envoy (gRPC rate limit service)",
        "tls (rustls, ring)",
    ];
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        compiled.push("io-uring");
    }
    println!("cargo:rustc-env=TURNSTILE_FEATURES={}", compiled.join(", "));
}
