//! The `[backend]` table: where the counts live (Redis, Redis Cluster), its failure policy,
//! and its leases.

use super::*;

impl Cx<'_> {
    pub(super) fn backend(&mut self, b: Spanned<RawBackend>) -> Result<Backend, RulesError> {
        let table = b.span();
        self.mark(Loc::Backend(""), table.clone());
        let b = b.into_inner();
        let nodes = match (b.redis, b.redis_cluster) {
            (Some(u), None) => {
                self.mark(Loc::Backend("redis"), u.span());
                RedisNodes::Single(u.into_inner())
            }
            (None, Some(v)) => {
                self.mark(Loc::Backend("redis"), v.span());
                let mut urls = Vec::new();
                for (k, u) in v.into_inner().into_iter().enumerate() {
                    self.mark(Loc::BackendUrl(k), u.span());
                    urls.push(u.into_inner());
                }
                RedisNodes::Cluster(urls)
            }
            (Some(_), Some(c)) => return Err(self.err(c.span(), "give one of redis (one node) and redis_cluster (the nodes of a cluster), not both")),
            (None, None) => return Err(self.err(table, "[backend] names no Redis: add redis = \"redis://127.0.0.1:6379\" or redis_cluster = [\"redis://127.0.0.1:7000\", ...] (leave the table out to keep the counts in memory)")),
        };
        let mut out = match nodes {
            RedisNodes::Single(u) => RedisBackend::single(u),
            RedisNodes::Cluster(v) => RedisBackend::cluster(v),
        };
        if let Some(t) = b.timeout {
            self.mark(Loc::Backend("timeout"), t.span());
            out.timeout = t.into_inner().0;
        }
        let policy = b.policy.map(|p| {
            self.mark(Loc::Backend("policy"), p.span());
            (p.span(), p.into_inner().0)
        });
        out.policy = match (policy, b.expected_nodes) {
            (None | Some((_, PolicyName::Closed)), None) => BackendPolicy::Closed,
            (Some((_, PolicyName::Open)), None) => BackendPolicy::Open,
            (Some((_, PolicyName::Insurance)), Some(n)) => {
                self.mark(Loc::Backend("expected_nodes"), n.span());
                BackendPolicy::Insurance {
                    expected_nodes: n.into_inner(),
                }
            }
            (Some((span, PolicyName::Insurance)), None) => return Err(self.err(span, "policy = \"insurance\" needs expected_nodes = N: how many processes share the limits (while Redis is away, each decides in memory at limit / N)")),
            (_, Some(n)) => return Err(self.err(n.span(), "`expected_nodes` applies to policy = \"insurance\"; remove it, or set policy = \"insurance\"")),
        };
        if let Some(p) = b.prefix {
            self.mark(Loc::Backend("prefix"), p.span());
            out.prefix = p.into_inner();
        }
        if let Some(s) = b.seed {
            self.mark(Loc::Backend("seed"), s.span());
            out.seed = s.into_inner();
        }
        out.leases = self.leases(b.leases, b.strand, b.mode, b.flush)?;
        Ok(Backend::Redis(out))
    }

    /// `[backend] leases`, `strand`, `mode`, `flush`.
    fn leases(
        &mut self,
        leases: Option<Spanned<Named<LeasesName>>>,
        strand: Option<Spanned<String>>,
        mode: Option<Spanned<Named<LeaseModeName>>>,
        flush: Option<Spanned<u64>>,
    ) -> Result<BackendLeases, RulesError> {
        let on = match leases {
            Some(l) => {
                self.mark(Loc::Backend("leases"), l.span());
                l.into_inner().0 == LeasesName::Auto
            }
            None => false,
        };
        let given = [
            strand.as_ref().map(|s| ("strand", s.span())),
            mode.as_ref().map(|m| ("mode", m.span())),
            flush.as_ref().map(|f| ("flush", f.span())),
        ];
        if !on {
            if let Some((name, span)) = given.into_iter().flatten().next() {
                return Err(self.err(
                    span,
                    format!("`{name}` applies to leases; add leases = \"auto\" or remove it"),
                ));
            }
            return Ok(BackendLeases::Off);
        }
        let strand_ppm = match strand {
            None => 50_000,
            Some(s) => {
                self.mark(Loc::Backend("strand"), s.span());
                let span = s.span();
                let text = s.into_inner();
                let pct = text
                    .strip_suffix('%')
                    .and_then(|n| n.trim().parse::<f64>().ok())
                    .filter(|p| (0.0..=50.0).contains(p));
                match pct {
                    Some(p) => (p * 10_000.0).round() as u32,
                    None => return Err(self.err(span, format!("strand = \"{text}\": give the final share of a window in which nothing is leased, as a percentage from 0% to 50% (e.g. \"5%\")"))),
                }
            }
        };
        let mode = match (mode.map(|m| (m.span(), m.into_inner().0)), flush) {
            (None | Some((_, LeaseModeName::Reserve)), None) => BackendLeaseMode::Reserve,
            (Some((_, LeaseModeName::Delayed)), f) => {
                let flush = match f {
                    Some(f) => {
                        self.mark(Loc::Backend("flush"), f.span());
                        let span = f.span();
                        match f.into_inner() {
                            0 => return Err(self.err(span, "flush = 0: a delayed lease records its admissions every `flush` of them; give at least 1")),
                            n => n,
                        }
                    }
                    None => 100,
                };
                BackendLeaseMode::Delayed { flush }
            }
            (_, Some(f)) => {
                return Err(self.err(
                    f.span(),
                    "`flush` applies to mode = \"delayed\"; remove it, or set mode = \"delayed\"",
                ))
            }
        };
        Ok(BackendLeases::Auto { strand_ppm, mode })
    }
}
