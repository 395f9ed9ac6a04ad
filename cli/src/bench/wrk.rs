//! wrk (an HTTP load generator) and redis-benchmark as the benchmarks run them, and their
//! output read back: requests per second, requests done and the 99th percentile.

use super::drive::{self, Run};

/// What a load generator reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Load {
    /// Requests per second, as the generator measured them.
    pub rps: f64,
    /// Requests done.
    pub requests: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
}

/// wrk's report (`--latency`): `Requests/sec:`, `N requests in`, and the `99%` line of the
/// latency distribution; `None` if one is missing. Non-2xx answers are an error: a benchmark
/// of refusals or failures is not the one asked for.
pub(crate) fn parse_wrk(out: &str) -> crate::Result<Load> {
    if let Some(l) = out.lines().find(|l| l.contains("Non-2xx")) {
        return Err(format!("wrk got answers other than 2xx: {}", l.trim()).into());
    }
    let field = |f: &dyn Fn(&str) -> Option<f64>| out.lines().find_map(|l| f(l.trim()));
    let rps = field(&|l| l.strip_prefix("Requests/sec:")?.trim().parse().ok());
    let requests = field(&|l| {
        let (n, rest) = l.split_once(' ')?;
        rest.starts_with("requests in").then(|| n.parse().ok())?
    });
    let p99 = field(&|l| duration_us(l.strip_prefix("99%")?.trim()));
    match (rps, requests, p99) {
        (Some(rps), Some(requests), Some(p99_us)) => Ok(Load {
            rps,
            requests,
            p99_us,
        }),
        _ => Err(format!("unexpected wrk output (run with --latency?):\n{out}").into()),
    }
}

/// wrk's durations: `812.00us`, `1.23ms`, `2.00s`, in microseconds.
fn duration_us(s: &str) -> Option<f64> {
    let (num, mul) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * mul)
}

/// redis-benchmark's `--csv` report: the header line, then
/// `"TEST","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",
/// "p99_latency_ms","max_latency_ms"`.
pub(crate) fn parse_redis_benchmark(out: &str, requests: u64) -> crate::Result<Load> {
    let row = out
        .lines()
        .filter(|l| !l.starts_with("\"test\""))
        .find(|l| l.starts_with('"'));
    let cols: Vec<f64> = row
        .map(|r| {
            r.split("\",\"")
                .skip(1)
                .filter_map(|c| c.trim_matches('"').parse().ok())
                .collect()
        })
        .unwrap_or_default();
    match cols.as_slice() {
        [rps, _avg, _min, _p50, _p95, p99, ..] => Ok(Load {
            rps: *rps,
            requests: requests as f64,
            p99_us: p99 * 1e3,
        }),
        _ => Err(format!("unexpected redis-benchmark --csv output:\n{out}").into()),
    }
}

/// A load generator pinned to `core`, run to its end.
pub(crate) fn run_pinned(core: usize, program: &str, args: &[String]) -> crate::Result<Run> {
    let mut c = drive::pinned(core, program);
    c.args(args);
    drive::run(c, program)
}

/// The wrk script of `POST /v1/check`: a customer drawn from `1..=keys` per request, the
/// body built per request (the same client work against the baseline, to `path`).
pub(crate) fn check_script(keys: u64, path: &str) -> String {
    format!(
        r#"math.randomseed(1)
request = function()
    local body = '{{"key_class":"customer","key":"' .. math.random(1, {keys}) .. '","route":"/v1/items","method":"GET"}}'
    return wrk.format("POST", "{path}", {{ ["content-type"] = "application/json" }}, body)
end
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK: &str = "Running 10s test @ http://127.0.0.1:3001/
  1 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   412.33us  101.20us   3.01ms   88.00%
    Req/Sec   121.54k     3.10k  126.00k    80.00%
  Latency Distribution
     50%  400.00us
     75%  450.00us
     90%  520.00us
     99%    1.02ms
  1209876 requests in 10.00s, 150.00MB read
Requests/sec: 120987.60
Transfer/sec:     15.00MB
";

    #[test]
    fn wrk_reports_are_read() {
        let l = parse_wrk(WRK).unwrap();
        assert_eq!((l.rps, l.requests, l.p99_us), (120987.6, 1209876.0, 1020.0));
        let refused = WRK.replace(
            "Requests/sec",
            "  Non-2xx or 3xx responses: 12\nRequests/sec",
        );
        assert!(parse_wrk(&refused)
            .unwrap_err()
            .to_string()
            .contains("Non-2xx"));
        let no_latency = WRK.replace("     99%    1.02ms\n", "");
        assert!(parse_wrk(&no_latency).is_err());
        assert_eq!(duration_us("2.50s"), Some(2.5e6));
        assert_eq!(duration_us("812.00us"), Some(812.0));
        assert_eq!(duration_us("fast"), None);
    }

    #[test]
    fn redis_benchmark_csv_is_read() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"CL.THROTTLE key:__rand_int__ 15 30 60\",\"312500.00\",\"2.400\",\"0.300\",\"2.300\",\"3.100\",\"4.500\",\"9.000\"\n";
        let l = parse_redis_benchmark(out, 1_000_000).unwrap();
        assert_eq!((l.rps, l.requests, l.p99_us), (312500.0, 1e6, 4500.0));
        assert!(parse_redis_benchmark("ERR unknown command", 1).is_err());
    }

    #[test]
    fn the_check_script_draws_customers() {
        let s = check_script(100_000, "/v1/check");
        assert!(
            s.contains("math.random(1, 100000)") && s.contains("\"/v1/check\""),
            "{s}"
        );
    }
}
