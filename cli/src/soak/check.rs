//! What the honest clients saw against what the server counted: each honest key looked at
//! once more, and `/metrics` before and after.

use super::attack;
use super::honest::{self, HonestRun, Seen};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// The honest keys looked at once more.
pub(super) struct KeyCheck {
    pub(super) keys: usize,
    pub(super) seen: u64,
    pub(super) consumed: u64,
    pub(super) mismatches: Vec<String>,
}

/// Each honest key's consumption (`CL.THROTTLE ... 0`, which spends nothing) against what its
/// client saw admitted: never above the budget, and equal to it, within the requests whose
/// reply was lost (an error after sending).
pub(super) async fn check_keys(
    con: &mut redis::aio::MultiplexedConnection,
    keys: &[Vec<String>],
    seen: &[Seen],
) -> KeyCheck {
    let mut out = KeyCheck {
        keys: 0,
        seen: 0,
        consumed: 0,
        mismatches: Vec::new(),
    };
    let budget = (honest::BURST + 1) as u64;
    for (names, s) in keys.iter().zip(seen) {
        for (k, name) in names.iter().enumerate() {
            out.keys += 1;
            let admitted = s.admitted.get(k).copied().unwrap_or(0);
            let unknown = s.unknown.get(k).copied().unwrap_or(0);
            out.seen += admitted;
            let r: redis::RedisResult<Vec<i64>> = honest::throttle(name, 0).query_async(con).await;
            let consumed = match r {
                Ok(v) if v.len() == 5 => budget.saturating_sub(v[2].max(0) as u64),
                other => {
                    out.mismatches
                        .push(format!("{name}: the look answered {other:?}"));
                    continue;
                }
            };
            out.consumed += consumed;
            let wrong = admitted > budget || consumed < admitted || consumed > admitted + unknown;
            if wrong && out.mismatches.len() < 20 {
                out.mismatches.push(format!(
                    "{name}: {admitted} admissions seen ({unknown} replies lost), {consumed} consumed of {budget}"
                ));
            }
        }
    }
    out
}

/// `/metrics` before and after against what the clients saw: the rules' checks exactly (only
/// the honest clients make any that count), CL.THROTTLE within what attackers that never read
/// may have added.
pub(super) fn metric_checks(
    before: Option<&HashMap<String, f64>>,
    after: Option<&HashMap<String, f64>>,
    seen: &HonestRun,
    st: &attack::Stats,
) -> Vec<serde_json::Value> {
    let (Some(b), Some(a)) = (before, after) else {
        return vec![json!({ "check": "/metrics", "ok": null, "said": "not readable" })];
    };
    let d = |k: &str| a.get(k).copied().unwrap_or(0.0) - b.get(k).copied().unwrap_or(0.0);
    let sum = |v: &[Seen], f: fn(&Seen) -> u64| v.iter().map(f).sum::<u64>() as f64;
    let unknown = |v: &[Seen]| v.iter().flat_map(|s| s.unknown.iter()).sum::<u64>() as f64;
    let mut out = Vec::new();
    let mut check = |name: &str, got: f64, lo: f64, hi: f64| {
        out.push(json!({ "check": name, "ok": got >= lo && got <= hi, "delta": got, "expected_from": lo, "expected_to": hi }));
    };
    let (ha, hd, hu) = (
        sum(&seen.http, |s| s.allowed),
        sum(&seen.http, |s| s.denied),
        unknown(&seen.http),
    );
    check(
        "turnstile_checks_total{result=\"allowed\"} = honest POST /v1/check admitted",
        d("turnstile_checks_total{result=\"allowed\"}"),
        ha,
        ha + hu,
    );
    check(
        "turnstile_checks_total{result=\"denied\"} = honest POST /v1/check denied",
        d("turnstile_checks_total{result=\"denied\"}"),
        hd,
        hd + hu,
    );
    let (ra, rd, ru) = (
        sum(&seen.resp, |s| s.allowed),
        sum(&seen.resp, |s| s.denied),
        unknown(&seen.resp),
    );
    let (aa, al, unread) = (
        st.throttle_allowed_seen.load(Ordering::Relaxed) as f64,
        st.throttle_limited_seen.load(Ordering::Relaxed) as f64,
        st.throttle_unread.load(Ordering::Relaxed) as f64,
    );
    check(
        "turnstile_throttle_total{result=\"allowed\"} >= admissions seen, <= + unread attacks",
        d("turnstile_throttle_total{result=\"allowed\"}"),
        ra + aa,
        ra + aa + ru + unread,
    );
    check(
        "turnstile_throttle_total{result=\"limited\"} >= denials seen, <= + unread attacks",
        d("turnstile_throttle_total{result=\"limited\"}"),
        rd + al,
        rd + al + ru + unread,
    );
    out
}
