//! `turnstile demo`: the design notes' scenarios, decided by the engine on a manual clock.

use std::time::Duration;
use turnstile::{Decision, Limit, Limiter, Limits, ManualClock};

const S: u64 = 1_000_000_000;

fn limiter(limits: Vec<Limit>) -> Limiter<ManualClock> {
    Limiter::with_limits(Limits::new(limits).expect("valid"), ManualClock::new(0))
}

fn show(at: &str, d: &Decision) -> String {
    let verdict = if d.allowed() { "allow" } else { "deny " };
    let retry = d
        .retry_after()
        .map(|r| format!(" retry_after={:.3}s", r.as_secs_f64()))
        .unwrap_or_default();
    let delay = if d.delay_ns > 0 {
        format!(" delay={:.3}s", d.delay().as_secs_f64())
    } else {
        String::new()
    };
    format!(
        "  {at:>10}  {verdict} remaining={}{retry}{delay}",
        d.remaining
    )
}

/// Checks one request of key 1 at each of `secs` (seconds), printing each decision under
/// `label(secs)`.
fn series(title: &str, l: &Limiter<ManualClock>, secs: &[u64], label: fn(u64) -> String) {
    println!("{title}");
    for &t in secs {
        println!("{}", show(&label(t), &l.check_at(1, t * S)));
    }
    println!();
}

/// `secs` after noon, as a wall clock: 12:00:59.
fn noon(secs: u64) -> String {
    format!("12:{:02}:{:02}", secs / 60, secs % 60)
}

/// Runs the demo.
pub fn run() -> crate::Result<()> {
    windows();
    sliding_window();
    token_buckets();
    two_limits();
    window_ring();
    leaky_bucket();
    concurrency();
    Ok(())
}

const MINUTE: Duration = Duration::from_secs(60);

/// The window-edge burst: a fixed window lets it through, a sliding log does not.
fn windows() {
    let fw = limiter(vec![Limit::fixed_window(3, MINUTE).unwrap()]);
    series(
        "fixed_window, 3 per minute (note 000): the window-edge burst passes",
        &fw,
        &[59, 59, 59, 59, 60, 60, 60, 60],
        noon,
    );
    let sl = limiter(vec![Limit::sliding_log(3, MINUTE).unwrap()]);
    series(
        "sliding_log, 3 per minute: exact, the edge burst does not",
        &sl,
        &[59, 59, 59, 60, 60, 119, 120],
        noon,
    );
}

/// The sliding window's estimate from the last minute's count and this one's.
fn sliding_window() {
    println!(
        "sliding_window, 7 per minute (note 002): 5 last minute, 3 this minute, request at 30 %"
    );
    let sw = limiter(vec![Limit::sliding_window(7, MINUTE).unwrap()]);
    for _ in 0..5 {
        sw.check_at(1, 30 * S);
    }
    for _ in 0..3 {
        sw.check_at(1, 61 * S);
    }
    println!("  estimate = 3 + 5 x 0.7 = 6.5 -> 6 < 7");
    println!("{}\n", show(&noon(78), &sw.check_at(1, 78 * S)));
}

/// A customer's burst, and note 000's 250 per minute refilling.
fn token_buckets() {
    let cust = limiter(vec![
        Limit::token_bucket(15, 15, Duration::from_secs(1)).unwrap()
    ]);
    let admitted = (0..20)
        .filter(|_| cust.check_at(1, 10 * S).allowed())
        .count();
    println!("token_bucket, customer A at 15 per second: {admitted} of 20 admitted at once");
    println!("{}\n", show("+0 ms", &cust.check_at(1, 10 * S)));

    println!("token_bucket, note 000's 250 per minute (capacity 250/60 = 4)");
    let tb = limiter(vec![Limit::token_bucket(4, 250, MINUTE).unwrap()]);
    for t in [1, 2] {
        let v: Vec<&str> = (0..5)
            .map(|_| {
                if tb.check_at(1, t * S).allowed() {
                    "true"
                } else {
                    "false"
                }
            })
            .collect();
        println!("  after {t} s: {}", v.join(" "));
    }
    println!();
}

/// Two limits on one key, all-or-nothing.
fn two_limits() {
    let gap = limiter(vec![
        Limit::sliding_log(10, MINUTE).unwrap(),
        Limit::token_bucket(1, 1, Duration::from_secs(2)).unwrap(),
    ]);
    series(
        "10 per minute and 2 s apart (note 002, problem 2): two limits, all-or-nothing",
        &gap,
        &[0, 1, 2, 3, 4],
        |t| format!("{t}.0 s"),
    );
}

/// An hour in one-minute buckets.
fn window_ring() {
    let wr = limiter(vec![
        Limit::window_ring(500, Duration::from_secs(3600), 60).unwrap()
    ]);
    let mut n = 0;
    for minute in 0..60u64 {
        for _ in 0..10 {
            n += wr.check_at(1, minute * 60 * S).allowed() as u32;
        }
    }
    println!("window_ring, 500 per hour in 60 one-minute buckets: 10 per minute for an hour -> {n} admitted");
    println!("{}\n", show("61st min", &wr.check_at(1, 3600 * S)));
}

/// nginx's shaper: delays within the burst, then refusals.
fn leaky_bucket() {
    let lb = limiter(vec![Limit::leaky_bucket(
        10,
        Duration::from_secs(1),
        5,
        Some(2),
    )
    .unwrap()]);
    println!("leaky_bucket shaper, nginx rate=10r/s burst=5 delay=2: 8 requests at once");
    for i in 0..8 {
        println!(
            "{}",
            show(&format!("req {}", i + 1), &lb.check_at(1, 5 * S))
        );
    }
    println!();
}

/// Permits held in flight, released when dropped.
fn concurrency() {
    let conc = Limiter::with_limits(
        Limits::new(vec![Limit::concurrency(2, Duration::from_secs(30)).unwrap()]).unwrap(),
        ManualClock::new(0),
    );
    let a = conc.acquire(1);
    let b = conc.acquire(1);
    let c = conc.acquire(1);
    println!(
        "concurrency, 2 in flight: acquire -> {}, {}, {}",
        a.is_ok(),
        b.is_ok(),
        c.is_ok()
    );
    drop(a);
    println!(
        "  after one permit is dropped: acquire -> {}",
        conc.acquire(1).is_ok()
    );
}
