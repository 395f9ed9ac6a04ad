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
        scope: Scope::Tests,
        why: "turnstile-redis, turnstile-tower (redis), turnstile serve's [backend] redis tests start their own redis-server",
    },
    Apt {
        package: "redis-tools",
        probe: Probe::Program("redis-cli"),
        scope: Scope::Tests,
        why: "the server's RESP tests talk to it with redis-cli (also over TLS, cli/tests/tls.rs); the Redis Cluster tests create their cluster with it",
    },
    Apt {
        package: "curl",
        probe: Probe::Program("curl"),
        scope: Scope::Tests,
        why: "the CLI's serve and TLS tests and the docs test call the HTTP API with curl",
    },
    Apt {
        package: "wrk",
        probe: Probe::Program("wrk"),
        scope: Scope::Tests,
        why: "turnstile bench tower's HTTP load (cli/tests/bench_drivers.rs)",
    },
    Apt {
        package: "valgrind",
        probe: Probe::Program("valgrind"),
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
        scope: Scope::Tests,
        why: "the Python clients' virtualenv",
    },
    Apt {
        package: "python3-venv",
        probe: Probe::PythonModule("ensurepip"),
        scope: Scope::Tests,
        why: "python3 -m venv (ensurepip)",
    },
];

/// What Node packages need from apt.
pub const NODE_APT: &[Apt] = &[
    Apt {
        package: "nodejs",
        probe: Probe::Program("node"),
        scope: Scope::Tests,
        why: "the Node clients",
    },
    Apt {
        package: "npm",
        probe: Probe::Program("npm"),
        scope: Scope::Tests,
        why: "npm install of the Node clients",
    },
];
