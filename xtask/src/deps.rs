//! What the tests need beyond the Rust toolchain: the one table to edit when a test starts
//! using another program or client library.
//!
//! * [`APT`]: Debian packages, each with the program on `PATH` that says it is installed.
//!   `cargo xtask test` installs the missing ones with `apt-get` (as root, or through
//!   `sudo -n`), or prints the one command that does.
//! * [`PIP`]: Python packages, installed into a virtualenv of the project's own
//!   (`target/test-deps/venv`, made with `python3 -m venv`). The tests find its interpreter in
//!   `TURNSTILE_TEST_PYTHON`.
//! * [`NPM`]: Node packages, installed into `target/test-deps/node` (`npm install --prefix`).
//!   The tests find its `node_modules` in `TURNSTILE_TEST_NODE_PATH` (give it to `node` as
//!   `NODE_PATH`).
//!
//! The Python and Node entries bring their own prerequisites (`python3`, `python3-venv`;
//! `nodejs`, `npm`) from apt when the table holds any. Pin versions in the specs
//! (`redis==5.2.1`, `ioredis@5.4.1`): the installed set is remembered, and a changed spec
//! installs again.
//!
//! A test that needs an entry should also fail with a message naming `cargo xtask test` when
//! the program or variable is missing, so that a bare `cargo test` says what to do.

/// A Debian package and what shows it is installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Apt {
    /// The package `apt-get install` takes.
    pub package: &'static str,
    /// What shows it is there.
    pub probe: Probe,
    /// The programs of the package the tests (or the docs) start: the only ones of it on
    /// their `PATH` ([`crate::hermetic`]).
    pub programs: &'static [&'static str],
    /// Who needs it.
    pub scope: Scope,
    /// Which tests need it.
    pub why: &'static str,
}

/// Who needs a package: `cargo xtask test` installs [`Scope::Tests`], `cargo xtask docs`
/// both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// `cargo test --release --workspace`.
    Tests,
    /// The docs test only (a program a page's commands run).
    Docs,
}

/// How `cargo xtask` tells whether a package is installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A program on `PATH`.
    Program(&'static str),
    /// A module `python3` can import.
    PythonModule(&'static str),
}

/// A Python package for the project's virtualenv.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pip {
    /// A requirement as `pip install` takes it, pinned: `redis==5.2.1`.
    pub spec: &'static str,
    /// Which tests need it.
    pub why: &'static str,
}

/// A Node package for the project's `node_modules`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Npm {
    /// A package as `npm install` takes it, pinned: `ioredis@5.4.1`.
    pub spec: &'static str,
    /// Which tests need it.
    pub why: &'static str,
}

/// Debian packages of programs the tests run.
pub const APT: &[Apt] = &[
    Apt {
        package: "redis-server",
        probe: Probe::Program("redis-server"),
        programs: &["redis-server"],
        scope: Scope::Tests,
        why: "turnstile-redis, turnstile-tower (redis), turnstile serve's [backend] redis tests (cli/tests/otel.rs's Redis spans among them) start their own redis-server; so do turnstile bench serve, fleet and report (cli/tests/bench_drivers.rs, cli/tests/bench_report.rs)",
    },
    Apt {
        package: "redis-tools",
        probe: Probe::Program("redis-cli"),
        programs: &["redis-cli", "redis-benchmark"],
        scope: Scope::Tests,
        why: "the server's RESP tests talk to it with redis-cli (also over TLS, cli/tests/tls.rs); the Redis Cluster tests create their cluster with it; redis-benchmark is turnstile bench serve's RESP load (cli/tests/bench_drivers.rs, cli/tests/bench_report.rs)",
    },
    Apt {
        package: "curl",
        probe: Probe::Program("curl"),
        programs: &["curl"],
        scope: Scope::Tests,
        why: "the CLI's serve and TLS tests and the docs test call the HTTP API with curl",
    },
    Apt {
        package: "wrk",
        probe: Probe::Program("wrk"),
        programs: &["wrk"],
        scope: Scope::Tests,
        why: "turnstile bench tower's and bench serve's HTTP load (cli/tests/bench_drivers.rs, cli/tests/bench_report.rs)",
    },
    Apt {
        package: "haproxy",
        probe: Probe::Program("haproxy"),
        programs: &["haproxy"],
        scope: Scope::Tests,
        why: "cli/tests/probes.rs: HAProxy's Redis check (tcp-check, expect role:master) against turnstile serve",
    },
    Apt {
        package: "valgrind",
        probe: Probe::Program("valgrind"),
        programs: &["valgrind", "valgrind.bin", "callgrind_annotate", "callgrind_control"],
        scope: Scope::Docs,
        why: "docs/performance.md's instruction counts (callgrind)",
    },
];

/// Python packages the tests import.
pub const PIP: &[Pip] = &[
    Pip {
        spec: "grpcio==1.85.3",
        why: "cli/tests/envoy_clients.rs: a gRPC client of Envoy's own rls.proto",
    },
    Pip {
        spec: "grpcio-tools==1.85.1",
        why: "cli/tests/envoy_clients.rs compiles rls.proto's stubs at test time",
    },
    Pip {
        spec: "redis==5.2.1",
        why: "cli/tests/clients.rs: redis-py (server/tests/clients/redis_py.py) against turnstile serve",
    },
];

/// Node packages the tests require.
pub const NPM: &[Npm] = &[Npm {
    spec: "ioredis@5.4.1",
    why: "cli/tests/clients.rs: ioredis (server/tests/clients/ioredis.js) against turnstile serve",
}];

/// What Python packages need from apt: an interpreter and its venv module (Debian splits
/// `ensurepip` into python3-venv).
pub const PYTHON_APT: &[Apt] = &[
    Apt {
        package: "python3",
        probe: Probe::Program("python3"),
        programs: &["python3"],
        scope: Scope::Tests,
        why: "the Python clients' virtualenv",
    },
    Apt {
        package: "python3-venv",
        probe: Probe::PythonModule("ensurepip"),
        programs: &[],
        scope: Scope::Tests,
        why: "python3 -m venv (ensurepip)",
    },
];

/// What Node packages need from apt.
pub const NODE_APT: &[Apt] = &[
    Apt {
        package: "nodejs",
        probe: Probe::Program("node"),
        programs: &["node"],
        scope: Scope::Tests,
        why: "the Node clients",
    },
    Apt {
        package: "npm",
        probe: Probe::Program("npm"),
        programs: &["npm"],
        scope: Scope::Tests,
        why: "npm install of the Node clients",
    },
];

/// The Rust toolchain: linked from the toolchain cargo runs with (`$CARGO`'s directory), not
/// from `~/.cargo/bin`, whose rustup proxies would put that whole directory (and whatever
/// `cargo install` put there) back on the `PATH` of everything they start.
pub const RUST: &[&str] = &["cargo", "rustc", "rustdoc"];

/// What builds the C parts of dependencies (mimalloc, ring) and links: the C compiler as
/// rustc and the `cc` crate call it, the archiver the `cc` crate calls, and the assembler and
/// linker gcc looks for on `PATH`.
pub const C_TOOLCHAIN: &[&str] = &["cc", "c++", "ar", "as", "ld"];

/// Programs of any Debian-like machine (coreutils, util-linux, procps, git) that the tests,
/// the build scripts or the binary start: assumed present, but listed, so that a new one is a
/// decision and not an accident.
pub const BASE: &[(&str, &str)] = &[
    ("sh", "build scripts, tests' shell lines"),
    (
        "bash",
        "cargo xtask docs runs each fence with bash; tests that script a server's start",
    ),
    ("env", "scripts' #!/usr/bin/env lines"),
    (
        "kill",
        "redis/tests/common: stops its redis-server by pid; xtask docs stops a fence's servers",
    ),
    (
        "sleep",
        "xtask's own tests of the docs runner: a fence that runs past its time",
    ),
    (
        "taskset",
        "turnstile bench's drivers pin the server and the load to cores (util-linux; cli/tests/bench_drivers.rs, cli/tests/bench_report.rs)",
    ),
    (
        "git",
        "cli/build.rs: the commit `turnstile --version` names; xtask docs restores files",
    ),
    (
        "grep",
        "the docs' fences pick lines of a reply (README, docs/*.md)",
    ),
    ("head", "docs/service.md: a password from /dev/urandom"),
    ("base64", "docs/service.md: a password from /dev/urandom"),
    ("seq", "README.md: ten requests in a loop"),
    (
        "perl",
        "callgrind_annotate is a Perl script (docs/performance.md)",
    ),
    (
        "pwd",
        "callgrind_annotate's Perl (Cwd) asks it for the working directory",
    ),
];
