//! The explanation of a decision (`TURNSTILE.EXPLAIN`, `POST /v1/check?explain=1`): the
//! engine's [`Explanation`] (every matching rule, each limit's counter, remaining and reset,
//! the key id, the mode, who decides; from peeks, consuming nothing) as one tree of named
//! fields ([`Node`]), which each protocol writes in its own syntax: JSON for HTTP, a RESP map
//! (a flat array in RESP2). The field names live here only, so the protocols agree.

use crate::check::{count, ms_up, Checks, NO_RULES};
use crate::resp::Out;
use turnstile::rules::{Explanation, LimitState, Request, RuleExplanation};
use turnstile::{Decision, Outcome};

/// Why an explanation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExplainError {
    /// The server has no rules.
    NoRules,
    /// The rules' counts are in Redis, which this process cannot peek at limit by limit.
    Redis,
}

impl std::fmt::Display for ExplainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExplainError::NoRules => f.write_str(NO_RULES),
            ExplainError::Redis => f.write_str(
                "explain is not available with the Redis backend (the rules file's [backend] \
                 table): the counts are in Redis; TURNSTILE.PEEK answers what a check would",
            ),
        }
    }
}

impl Checks {
    /// Explains a check of `req` with the counts in memory; refused with them in Redis.
    pub(crate) fn explanation(&self, req: &Request<'_>) -> Result<Explanation, ExplainError> {
        let engine = self.engine.as_ref().ok_or(ExplainError::NoRules)?;
        if self.backends.redis().is_some() {
            return Err(ExplainError::Redis);
        }
        Ok(engine.explanation(req))
    }
}

/// A value of the explanation, protocol-neutral.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Node {
    Int(i64),
    Bool(bool),
    Text(String),
    Null,
    List(Vec<Node>),
    Map(Vec<(&'static str, Node)>),
}

impl Node {
    /// As RESP: maps as maps (flat arrays in RESP2), booleans as 0/1 as `TURNSTILE.CHECK`
    /// answers them, text as bulk strings.
    pub(crate) fn resp(&self, o: &mut Out<'_>) {
        match self {
            Node::Int(n) => o.int(*n),
            Node::Bool(b) => o.int(i64::from(*b)),
            Node::Text(s) => o.bulk(s.as_bytes()),
            Node::Null => o.null(),
            Node::List(l) => {
                o.array(l.len());
                l.iter().for_each(|n| n.resp(o));
            }
            Node::Map(m) => {
                o.map(m.len());
                for (k, v) in m {
                    o.bulk(k.as_bytes());
                    v.resp(o);
                }
            }
        }
    }
}

/// As JSON, fields in their order (booleans as booleans, `Null` as null).
impl serde::Serialize for Node {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Node::Int(n) => s.serialize_i64(*n),
            Node::Bool(b) => s.serialize_bool(*b),
            Node::Text(t) => s.serialize_str(t),
            Node::Null => s.serialize_unit(),
            Node::List(l) => {
                let mut q = s.serialize_seq(Some(l.len()))?;
                for n in l {
                    q.serialize_element(n)?;
                }
                q.end()
            }
            Node::Map(m) => {
                let mut q = s.serialize_map(Some(m.len()))?;
                for (k, v) in m {
                    q.serialize_entry(k, v)?;
                }
                q.end()
            }
        }
    }
}

/// The outcome as `POST /v1/check` spells it (the variant's name, as `Debug` prints it).
pub(crate) fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Allowed => "Allowed",
        Outcome::Limited => "Limited",
        Outcome::NeverFits => "NeverFits",
        Outcome::StoreFull => "StoreFull",
        Outcome::Untracked => "Untracked",
        // `Outcome` is non-exhaustive: a later variant is still an answer, not a panic.
        _ => "Other",
    }
}

fn retry(ns: Option<u64>) -> Node {
    ns.map_or(Node::Null, |ns| Node::Int(ms_up(ns)))
}

/// A decision's fields, as `POST /v1/check` names them.
fn decision(d: &Decision) -> Vec<(&'static str, Node)> {
    vec![
        ("allowed", Node::Bool(d.allowed())),
        ("outcome", Node::Text(outcome_name(d.outcome).into())),
        ("limit", Node::Int(count(d.limit))),
        ("remaining", Node::Int(count(d.remaining))),
        ("retry_after_ms", retry(d.retry_after_ns)),
        ("reset_after_ms", Node::Int(ms_up(d.reset_after_ns))),
    ]
}

fn limit(l: &LimitState) -> Node {
    Node::Map(vec![
        ("algorithm", Node::Text(l.algorithm.name().into())),
        ("limit", Node::Int(count(l.limit))),
        ("counter", Node::Int(count(l.used))),
        ("remaining", Node::Int(count(l.remaining))),
        ("reset_after_ms", Node::Int(ms_up(l.reset_after_ns))),
        ("admits", Node::Bool(l.admits)),
        ("remaining_after", Node::Int(count(l.remaining_after))),
        ("retry_after_ms", retry(l.retry_after_ns)),
    ])
}

fn rule(r: &RuleExplanation) -> Node {
    let mut m = vec![
        ("rule", Node::Text(r.rule.to_string())),
        ("mode", Node::Text(r.mode.name().into())),
        // Text: a key id is a u64, past JSON's exact integers and RESP's signed ones.
        ("key", Node::Text(r.key.to_string())),
        ("cost", Node::Int(count(r.cost))),
        ("limits_from", Node::Text(r.limits_from.name().into())),
        ("step", Node::Text(r.step.name().into())),
    ];
    m.extend(decision(&r.decision));
    m.push(("limits", Node::List(r.limits.iter().map(limit).collect())));
    if !r.pool.is_empty() {
        m.push(("pool_open", Node::Bool(r.pool_open)));
        m.push(("pool", Node::List(r.pool.iter().map(limit).collect())));
    }
    Node::Map(m)
}

/// The whole explanation: the verdict as `POST /v1/check` answers it, then who decides and
/// every matching rule.
pub(crate) fn tree(x: &Explanation) -> Node {
    let v = &x.verdict;
    let mut m = decision(&v.decision);
    m.push((
        "rule",
        v.rule
            .as_ref()
            .map_or(Node::Null, |r| Node::Text(r.to_string())),
    ));
    m.push(("shed", Node::Bool(v.shed)));
    m.push(("cost", Node::Int(count(x.cost))));
    m.push(("priority", Node::Text(x.priority.name().into())));
    let by = x.decided_by.map_or(Node::Null, |d| {
        Node::Map(vec![
            ("rule", Node::Text(x.rules[d.rule].rule.to_string())),
            ("limit", d.limit.map_or(Node::Null, |l| Node::Int(l as i64))),
        ])
    });
    m.push(("decided_by", by));
    m.push(("rules", Node::List(x.rules.iter().map(rule).collect())));
    Node::Map(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::Proto;

    #[test]
    fn one_tree_two_syntaxes() {
        let n = Node::Map(vec![
            ("a", Node::Int(-1)),
            ("b", Node::List(vec![Node::Bool(true), Node::Null])),
            ("c", Node::Text("x".into())),
        ]);
        let n = Node::Map(vec![
            ("z", Node::Int(0)),
            ("a", Node::Map(vec![])),
            ("n", n),
        ]);
        assert_eq!(
            serde_json::to_string(&n).unwrap(),
            r#"{"z":0,"a":{},"n":{"a":-1,"b":[true,null],"c":"x"}}"#
        );
        let Node::Map(m) = n else { unreachable!() };
        let n = m[2].1.clone();
        let mut buf = Vec::new();
        n.resp(&mut Out {
            buf: &mut buf,
            proto: Proto::Resp2,
        });
        assert_eq!(
            buf,
            b"*6\r\n$1\r\na\r\n:-1\r\n$1\r\nb\r\n*2\r\n:1\r\n$-1\r\n$1\r\nc\r\n$1\r\nx\r\n"
        );
        buf.clear();
        n.resp(&mut Out {
            buf: &mut buf,
            proto: Proto::Resp3,
        });
        assert!(buf.starts_with(b"%3\r\n"));
    }
}
