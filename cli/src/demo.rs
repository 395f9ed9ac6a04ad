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

fn series(title: &str, l: &Limiter<ManualClock>, reqs: &[(u64, &str)]) {
    println!("{title}");
    for &(t, label) in reqs {
        println!("{}", show(label, &l.check_at(1, t)));
    }
    println!();
}

/// Runs the demo.
pub fn run() -> crate::Result<()> {
    let m = |secs: u64| secs * S;
    let min = Duration::from_secs(60);

    let fw = limiter(vec![Limit::fixed_window(3, min).unwrap()]);
    series(
        "fixed_window, 3 per minute (note 000): the window-edge burst passes",
        &fw,
        &[
            (m(59), "12:00:59"),
            (m(59), "12:00:59"),
            (m(59), "12:00:59"),
            (m(59), "12:00:59"),
            (m(60), "12:01:00"),
            (m(60), "12:01:00"),
            (m(60), "12:01:00"),
            (m(60), "12:01:00"),
        ],
    );
    let sl = limiter(vec![Limit::sliding_log(3, min).unwrap()]);
    series(
        "sliding_log, 3 per minute: exact, the edge burst does not",
        &sl,
        &[
            (m(59), "12:00:59"),
            (m(59), "12:00:59"),
            (m(59), "12:00:59"),
            (m(60), "12:01:00"),
            (m(60), "12:01:00"),
            (m(119), "12:01:59"),
            (m(120), "12:02:00"),
        ],
    );

    println!(
        "sliding_window, 7 per minute (note 002): 5 last minute, 3 this minute, request at 30 %"
    );
    let sw = limiter(vec![Limit::sliding_window(7, min).unwrap()]);
    for _ in 0..5 {
        sw.check_at(1, m(30));
    }
    for _ in 0..3 {
        sw.check_at(1, m(61));
    }
    println!("  estimate = 3 + 5 x 0.7 = 6.5 -> 6 < 7");
    println!("{}\n", show("12:01:18", &sw.check_at(1, m(78))));

    let cust = limiter(vec![
        Limit::token_bucket(15, 15, Duration::from_secs(1)).unwrap()
    ]);
    let admitted = (0..20)
        .filter(|_| cust.check_at(1, m(10)).allowed())
        .count();
    println!("token_bucket, customer A at 15 per second: {admitted} of 20 admitted at once");
    println!("{}\n", show("+0 ms", &cust.check_at(1, m(10))));

    println!("token_bucket, note 000's 250 per minute (capacity 250/60 = 4)");
    let tb = limiter(vec![Limit::token_bucket(4, 250, min).unwrap()]);
    for t in [1, 2] {
        let v: Vec<&str> = (0..5)
            .map(|_| {
                if tb.check_at(1, m(t)).allowed() {
                    "true"
                } else {
                    "false"
                }
            })
            .collect();
        println!("  after {t} s: {}", v.join(" "));
    }
    println!();

    let gap = limiter(vec![
        Limit::sliding_log(10, min).unwrap(),
        Limit::token_bucket(1, 1, Duration::from_secs(2)).unwrap(),
    ]);
    series(
        "10 per minute and 2 s apart (note 002, problem 2): two limits, all-or-nothing",
        &gap,
        &[
            (m(0), "0.0 s"),
            (m(1), "1.0 s"),
            (m(2), "2.0 s"),
            (m(3), "3.0 s"),
            (m(4), "4.0 s"),
        ],
    );

    let wr = limiter(vec![
        Limit::window_ring(500, Duration::from_secs(3600), 60).unwrap()
    ]);
    let mut n = 0;
    for minute in 0..60u64 {
        for _ in 0..10 {
            n += wr.check_at(1, m(minute * 60)).allowed() as u32;
        }
    }
    println!("window_ring, 500 per hour in 60 one-minute buckets: 10 per minute for an hour -> {n} admitted");
    println!("{}\n", show("61st min", &wr.check_at(1, m(3600))));

    let lb = limiter(vec![Limit::leaky_bucket(
        10,
        Duration::from_secs(1),
        5,
        Some(2),
    )
    .unwrap()]);
    println!("leaky_bucket shaper, nginx rate=10r/s burst=5 delay=2: 8 requests at once");
    for i in 0..8 {
        println!("{}", show(&format!("req {}", i + 1), &lb.check_at(1, m(5))));
    }
    println!();

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
    Ok(())
}
