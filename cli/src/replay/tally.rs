//! What one rules file did with the replayed requests: per rule, the requests it decided,
//! admitted, denied (by which limit) or would have denied (shadow rules), its keys (how many,
//! how many ever limited, the most denied ones with their first denial), and per minute the
//! traffic and the denials. Every structure is bounded: counters per rule, a space-saving
//! sketch of [`TOP_K`] keys per rule, a distinct count per rule ([`Distinct`]), and the
//! per-minute [`Series`].

use super::distinct::Distinct;
use super::keys::{self, View};
use super::series::Series;
use super::topk::TopK;
use turnstile::clock::ManualClock;
use turnstile::rules::{Engine, KeyClass, Mode, RuleOutcome, Rules};

/// Keys tracked per rule by the sketch of the most denied.
pub const TOP_K: usize = 1024;
/// Limits tracked per rule (distinct `limit`s of its denials; overrides add some).
const LIMITS: usize = 16;

/// One rule's figures.
pub struct RuleTally {
    pub name: String,
    pub mode: Mode,
    pub class: KeyClass,
    /// Each of its limits as written, by the `limit` (or a bucket's burst) a denial names.
    pub limits: Vec<(u64, String)>,
    /// Requests it decided (it matched them, they had its key, and no rule before it denied).
    pub requests: u64,
    /// Admitted by it (enforcing rules; an elastic rule's pool admissions included).
    pub admitted: u64,
    /// Admitted by an elastic rule's extra pool.
    pub pooled: u64,
    /// Denied by it.
    pub denied: u64,
    /// Shadow rules: would have denied.
    pub would_deny: u64,
    /// Denials (or would-be denials) by the `limit` of the limit that denied.
    pub by_limit: Vec<(u64, u64)>,
    /// Keys it decided for, and keys it denied (or would have).
    pub keys: Distinct,
    pub limited: Distinct,
    /// The most denied keys.
    pub top: TopK,
}

/// One rules file's replay.
pub struct Tally {
    pub engine: Engine<ManualClock>,
    pub rules: Vec<RuleTally>,
    pub requests: u64,
    pub denied: u64,
    /// Requests no rule decided.
    pub unmatched: u64,
    /// Requests some shadow rule would have denied.
    pub would_deny: u64,
    /// Columns: requests, denied, would-deny, then per rule its denials or would-be denials.
    pub series: Series,
    text: String,
}

/// The series' fixed columns.
pub const COL_REQUESTS: usize = 0;
pub const COL_DENIED: usize = 1;
pub const COL_WOULD: usize = 2;
pub const COL_RULES: usize = 3;

/// What one request got: allowed, and the rule that denied it (its index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    pub denier: Option<usize>,
}

impl Tally {
    /// An engine for `rules` (in memory whatever their backend: a replay is one process with
    /// its own clock, the log's) and empty figures.
    pub fn new(rules: Rules) -> crate::Result<Tally> {
        let tallies: Vec<RuleTally> = rules
            .rules
            .iter()
            .map(|r| RuleTally {
                name: r.name.clone(),
                mode: r.mode,
                class: r.key,
                limits: r
                    .limits
                    .iter()
                    .flat_map(|l| {
                        let w = humantime(l.window);
                        let text = match l.burst {
                            Some(b) => format!("{} per {w}, burst {b} ({})", l.limit, l.algorithm),
                            None => format!("{} per {w} ({})", l.limit, l.algorithm),
                        };
                        // A denial names the limit by its `limit`, or a bucket by its burst.
                        [Some((l.limit, text.clone())), l.burst.map(|b| (b, text))]
                    })
                    .flatten()
                    .collect(),
                requests: 0,
                admitted: 0,
                pooled: 0,
                denied: 0,
                would_deny: 0,
                by_limit: Vec::new(),
                keys: Distinct::default(),
                limited: Distinct::default(),
                top: TopK::new(TOP_K),
            })
            .collect();
        let mut rules = rules;
        rules.backend = turnstile::rules::Backend::Memory;
        let engine = Engine::builder(rules)
            .seed(0x7265_706c_6179)
            .build_with_clock(ManualClock::new(0))?;
        let n = tallies.len();
        Ok(Tally {
            engine,
            rules: tallies,
            requests: 0,
            denied: 0,
            unmatched: 0,
            would_deny: 0,
            series: Series::new(COL_RULES + n),
            text: String::new(),
        })
    }

    /// Checks one request at `now` (ns since the Unix epoch) and counts what every rule did.
    #[inline]
    pub fn check(&mut self, v: &View<'_>, now: u64) -> Outcome {
        let Tally {
            engine,
            rules,
            series,
            text,
            ..
        } = self;
        let mut decided = false;
        let mut denier = None;
        let verdict = engine.trace_at(&v.req, now, |i, o| {
            decided = true;
            let r = &mut rules[i];
            r.requests += 1;
            let key = keys::hash(r.class, v);
            if let Some(h) = key {
                r.keys.add(h);
            }
            let d = match o {
                RuleOutcome::Admitted => {
                    r.admitted += 1;
                    return;
                }
                RuleOutcome::Pooled => {
                    r.admitted += 1;
                    r.pooled += 1;
                    return;
                }
                RuleOutcome::WouldAdmit => return,
                RuleOutcome::Denied(d) => {
                    r.denied += 1;
                    denier = Some(i);
                    d
                }
                RuleOutcome::WouldDeny(d) => {
                    r.would_deny += 1;
                    d
                }
            };
            match r.by_limit.iter().position(|(l, _)| *l == d.limit) {
                Some(k) => r.by_limit[k].1 += 1,
                None if r.by_limit.len() < LIMITS => r.by_limit.push((d.limit, 1)),
                None => {}
            }
            series.add(now, COL_RULES + i, 1);
            if let Some(h) = key {
                r.limited.add(h);
                let class = r.class;
                r.top.add(h, now, |t| {
                    text.clear();
                    keys::text(class, v, text);
                    t.push_str(text);
                });
            }
        });
        self.requests += 1;
        series.add(now, COL_REQUESTS, 1);
        let allowed = verdict.decision.allowed();
        if !allowed {
            self.denied += 1;
            series.add(now, COL_DENIED, 1);
        }
        if verdict.would_deny > 0 {
            self.would_deny += 1;
            series.add(now, COL_WOULD, 1);
        }
        if !decided {
            self.unmatched += 1;
        }
        Outcome { allowed, denier }
    }
}

/// `1h`, `30s`, `1500ms`: a window as a rules file would write it.
pub fn humantime(d: std::time::Duration) -> String {
    let ns = d.as_nanos();
    for (unit, n) in [
        ("d", 86_400_000_000_000u128),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if ns >= n && ns % n == 0 {
            return format!("{}{unit}", ns / n);
        }
    }
    format!("{ns}ns")
}
