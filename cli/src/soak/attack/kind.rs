//! The kinds of hostile client, their shares of the attacking connections, and what each
//! needs of the server (which listeners).

/// A kind of hostile client (`--kinds` takes the kebab-case names: `slow-body`, `fd-hog`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Kind {
    /// Frames past every bound, before and after AUTH: `*128` arrays of 512 KiB bulks, a bulk
    /// longer than `--max-bulk`, an inline line past its limit; each followed by 256 KiB.
    Giant,
    /// Authenticated, sends all of the largest frame the bounds allow but its last byte, and
    /// waits: the server must hold it whole.
    HoldFrame,
    /// Authenticated, pipelines COMMAND, INFO and CL.THROTTLE and never reads a reply.
    NeverRead,
    /// Never authenticates and floods commands: half read the NOAUTH replies, half never read.
    UnauthFlood,
    /// Authenticated, each CL.THROTTLE with a parameter set never seen before.
    NewParams,
    /// RESP garbage: random bytes, wrong types, negative and huge lengths, NULs, bare CRLFs.
    Garbage,
    /// Authenticated, opens a MULTI, queues commands past its bound and never sends EXEC.
    MultiNoExec,
    /// Tagged customer ids (`customer user:7`), over RESP and POST /v1/check.
    TaggedIds,
    /// HTTP headers one byte a second (slowloris).
    Slowloris,
    /// POST /v1/check with a body far past `--max-body` (a length, chunked, no password).
    BigBody,
    /// HTTP without credentials: /v1/check, /metrics, /v1/reload; and /healthz.
    NoCreds,
    /// HTTP/1 POST /v1/check with complete headers (with and without credentials) and a body
    /// trickled at one byte a second, or never sent.
    SlowBody,
    /// HTTP/2 with prior knowledge (on the HTTP port, and on the gRPC port): as many streams
    /// as the server allows, each with a body one byte short of `--max-body`, never ended;
    /// with and without credentials; and the h2c upgrade asked over HTTP/1.
    H2Streams,
    /// POST /json bodies of several MiB (past `--max-body`), with credentials when there is a
    /// password, and without.
    JsonBig,
    /// TCP connections to the gRPC listener that send nothing.
    GrpcSilent,
    /// gRPC: the HTTP/2 preface and nothing more, or a ShouldRateLimit call whose message is
    /// trickled at one byte a second (with and without credentials).
    GrpcSlow,
    /// As many idle connections as it can open (its own limit and `--connections`), spread
    /// over RESP, HTTP and gRPC.
    FdHog,
    /// RESP connections that never AUTH, sending a PING every few seconds (each NOAUTH
    /// reply is progress for an idle timer).
    UnauthHolder,
    /// Wrong passwords as fast as the server answers: RESP AUTH, HTTP Bearer tokens, gRPC
    /// `authorization` metadata.
    AuthGuess,
    /// The admin listener: PUT /v1/limits/... and POST /v1/reload without credentials and
    /// with the client password.
    AdminNocreds,
}

/// The listeners a run has, besides RESP.
#[derive(Clone, Copy, Debug, Default)]
pub struct Listeners {
    pub http: bool,
    pub grpc: bool,
    pub admin: bool,
}

impl Kind {
    /// Every kind with its share of the connections (per cent).
    pub const MIX: [(Kind, u32); 20] = [
        (Kind::Giant, 6),
        (Kind::HoldFrame, 6),
        (Kind::NeverRead, 8),
        (Kind::UnauthFlood, 6),
        (Kind::NewParams, 2),
        (Kind::Garbage, 4),
        (Kind::MultiNoExec, 6),
        (Kind::TaggedIds, 3),
        (Kind::Slowloris, 6),
        (Kind::BigBody, 5),
        (Kind::NoCreds, 4),
        (Kind::SlowBody, 7),
        (Kind::H2Streams, 6),
        (Kind::JsonBig, 3),
        (Kind::GrpcSilent, 5),
        (Kind::GrpcSlow, 5),
        (Kind::FdHog, 5),
        (Kind::UnauthHolder, 7),
        (Kind::AuthGuess, 3),
        (Kind::AdminNocreds, 3),
    ];

    /// What the report calls it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Giant => "giant frames",
            Kind::HoldFrame => "largest frame held",
            Kind::NeverRead => "never reads",
            Kind::UnauthFlood => "unauthenticated flood",
            Kind::NewParams => "new CL.THROTTLE parameters",
            Kind::Garbage => "RESP garbage",
            Kind::MultiNoExec => "MULTI without EXEC",
            Kind::TaggedIds => "tagged customer ids",
            Kind::Slowloris => "slow HTTP headers",
            Kind::BigBody => "oversized HTTP bodies",
            Kind::NoCreds => "HTTP without credentials",
            Kind::SlowBody => "slow HTTP bodies",
            Kind::H2Streams => "HTTP/2 unfinished streams",
            Kind::JsonBig => "big /json bodies",
            Kind::GrpcSilent => "silent gRPC connections",
            Kind::GrpcSlow => "slow gRPC calls",
            Kind::FdHog => "descriptor hog",
            Kind::UnauthHolder => "unauthenticated holders",
            Kind::AuthGuess => "password guessing",
            Kind::AdminNocreds => "admin without credentials",
        }
    }

    /// Its `--kinds` name.
    pub fn flag(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// Whether it can run against a server with these listeners (RESP is always there).
    pub fn runs_with(self, l: Listeners) -> bool {
        match self {
            Kind::Slowloris | Kind::BigBody | Kind::NoCreds | Kind::SlowBody | Kind::JsonBig => {
                l.http
            }
            Kind::H2Streams => l.http || l.grpc,
            Kind::GrpcSilent | Kind::GrpcSlow => l.grpc,
            Kind::AdminNocreds => l.admin,
            _ => true,
        }
    }

    /// Whether its connections go to the HTTP listener (those the memory bound counts as
    /// HTTP connections).
    pub fn http(self) -> bool {
        matches!(
            self,
            Kind::Slowloris | Kind::BigBody | Kind::NoCreds | Kind::SlowBody | Kind::JsonBig
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_the_documented_names() {
        let names: Vec<String> = Kind::MIX.iter().map(|(k, _)| k.flag()).collect();
        for n in [
            "slow-body",
            "h2-streams",
            "json-big",
            "grpc-silent",
            "grpc-slow",
            "fd-hog",
            "unauth-holder",
            "auth-guess",
            "admin-nocreds",
        ] {
            assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
        }
        assert_eq!(Kind::MIX.iter().map(|m| m.1).sum::<u32>(), 100);
        let everything = Listeners {
            http: true,
            grpc: true,
            admin: true,
        };
        assert!(Kind::MIX.iter().all(|(k, _)| k.runs_with(everything)));
    }
}
