//! [`Engine::trace_at`]: a check that reports what each rule did with the request, for tools
//! that account per rule (`turnstile replay`).

use super::check::Track;
use super::{Engine, Verdict};
use crate::clock::{Clock, Nanos};
use crate::decision::Decision;
use crate::rules::request::Request;

/// What one rule did with a request, as [`Engine::trace_at`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleOutcome {
    /// An enforcing rule admitted it from its own limits. Its charge is kept unless a later
    /// rule denies the request (then it is given back: all-or-nothing).
    Admitted,
    /// An elastic rule admitted it from its extra pool.
    Pooled,
    /// An enforcing rule denied it: the answer, with the denying limit's `limit`.
    Denied(Decision),
    /// A shadow rule would have admitted it.
    WouldAdmit,
    /// A shadow rule would have denied it: its decision, with the denying limit's `limit`.
    WouldDeny(Decision),
}

/// Calls the caller's function for each rule's step, and keeps what [`Verdict`] needs.
struct Trace<F> {
    f: F,
    rule: Option<u32>,
    shed: bool,
    matched: u32,
    would_deny: u32,
}

impl<F: FnMut(usize, RuleOutcome)> Track for Trace<F> {
    const GENERAL: bool = true;
    fn shed(&mut self) {
        self.shed = true;
    }
    fn matched(&mut self, rule: u32, pooled: bool) {
        self.matched += 1;
        let o = if pooled {
            RuleOutcome::Pooled
        } else {
            RuleOutcome::Admitted
        };
        (self.f)(rule as usize, o);
    }
    fn denied(&mut self, rule: u32, d: &Decision) {
        self.rule = Some(rule);
        (self.f)(rule as usize, RuleOutcome::Denied(*d));
    }
    fn would_deny(&mut self, rule: u32, d: &Decision) {
        self.would_deny += 1;
        (self.f)(rule as usize, RuleOutcome::WouldDeny(*d));
    }
    fn would_admit(&mut self, rule: u32) {
        (self.f)(rule as usize, RuleOutcome::WouldAdmit);
    }
}

impl<C: Clock> Engine<C> {
    /// [`Engine::explain_at`], calling `f(rule, outcome)` for each rule that decided the
    /// request, in the order they did: the enforcing rules in file order up to the first
    /// denial, then (if none denied) the shadow rules. `rule` is the rule's index in
    /// [`Engine::rule_names`]. Rules the request does not match, or whose key it lacks, are
    /// not reported; nor are the enforcing rules after a denial, which are only asked when
    /// the request could be retried (see the module docs). The decisions and the rules'
    /// counters are exactly those of [`Engine::check_at`]. Indexes refer to the rules loaded
    /// at the check: a caller that reloads reads the names again.
    pub fn trace_at(
        &self,
        req: &Request<'_>,
        now: Nanos,
        f: impl FnMut(usize, RuleOutcome),
    ) -> Verdict {
        let c = self.current.load();
        let mut t = Trace {
            f,
            rule: None,
            shed: false,
            matched: 0,
            would_deny: 0,
        };
        let decision = self.eval_in(&c, req, now, &mut t);
        Verdict {
            decision,
            rule: t
                .rule
                .and_then(|i| c.rules.get(i as usize))
                .map(|r| r.name.clone()),
            shed: t.shed,
            matched: t.matched,
            would_deny: t.would_deny,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RuleOutcome;
    use crate::clock::ManualClock;
    use crate::rules::{Engine, Request, Rules};

    const RULES: &str = r#"
[[rule]]
name = "a"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 2, window = "1s" }]
[[rule]]
name = "b"
key = "customer"
limits = [{ algorithm = "fixed_window", limit = 3, window = "1s" }]
[[rule]]
name = "s"
key = "customer"
mode = "shadow"
limits = [{ algorithm = "fixed_window", limit = 1, window = "1s" }]
"#;

    #[test]
    fn each_rule_reports_its_step() {
        let rules = Rules::parse(RULES, "t").unwrap();
        let e = Engine::builder(rules)
            .build_with_clock(ManualClock::new(0))
            .unwrap();
        let req = Request::new().customer(7);
        let mut seen = Vec::new();
        for _ in 0..3 {
            let mut steps = Vec::new();
            let v = e.trace_at(&req, 1, |r, o| steps.push((r, o)));
            seen.push((v.decision.allowed(), steps));
        }
        let kinds: Vec<Vec<(usize, &str)>> = seen
            .iter()
            .map(|(_, s)| {
                s.iter()
                    .map(|(r, o)| {
                        let k = match o {
                            RuleOutcome::Admitted => "admitted",
                            RuleOutcome::Pooled => "pooled",
                            RuleOutcome::Denied(_) => "denied",
                            RuleOutcome::WouldAdmit => "would admit",
                            RuleOutcome::WouldDeny(_) => "would deny",
                        };
                        (*r, k)
                    })
                    .collect()
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                vec![(0, "admitted"), (1, "admitted"), (2, "would admit")],
                vec![(0, "admitted"), (1, "admitted"), (2, "would deny")],
                vec![(0, "denied")],
            ]
        );
        match seen[2].1[0].1 {
            RuleOutcome::Denied(d) => assert_eq!(d.limit, 2),
            o => panic!("{o:?}"),
        }
        assert_eq!(e.rule_stats("s").unwrap().would_deny, 1);
    }
}
