//! `--generate N`: a synthetic access log of `N` lines on standard output, for measuring and
//! trying replays (`docs/replay.md`). Deterministic for a seed: a day of traffic (a daily
//! cycle, quietest at 04:00 UTC, busiest at 16:00) from 20 000 customers of Zipf-like
//! popularity, each from its own address, over a small API (customer reads, search, charges,
//! balance, login, health checks); and three abusers: customer 100007 bursting on
//! `/v1/charges` 09:00-09:30, a scraper without a customer from 198.51.100.0/24 on
//! `/v1/search` 14:00-15:00, and customer 100042 polling `/v1/balance` all day.

use super::format::Format;
use super::time::{civil_from_days, format_clf};
use std::io::Write;

/// splitmix64: a small, fast, deterministic generator (the traffic's only randomness).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 2024-03-04T00:00:00Z: the generated day.
const DAY0: u64 = 1_709_510_400;
const CUSTOMERS: u64 = 20_000;

/// One generated request.
struct Req {
    secs: u64,
    nanos: u32,
    ip: [u8; 4],
    port: u16,
    customer: Option<u64>,
    method: &'static str,
    path: String,
    status: u16,
    bytes: u64,
    agent: &'static str,
}

const AGENTS: [&str; 4] = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/122.0 Safari/537.36",
    "python-requests/2.31.0",
    "okhttp/4.12.0",
    "curl/8.5.0",
];

fn address(c: u64) -> [u8; 4] {
    let h = c.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    [
        23 + (h % 180) as u8,
        (h >> 8) as u8,
        (h >> 16) as u8,
        1 + (h >> 24) as u8 % 250,
    ]
}

/// The request of second `s` of the day (0..86 400).
fn request(rng: &mut Rng, s: u64) -> Req {
    let hour = s / 3600;
    let mut r = Req {
        secs: DAY0 + s,
        nanos: 0,
        ip: [0; 4],
        port: 1024 + rng.below(60_000) as u16,
        customer: None,
        method: "GET",
        path: String::new(),
        status: 200,
        bytes: 200 + rng.below(4000),
        agent: AGENTS[rng.below(4) as usize],
    };
    let u = rng.unit();
    if (32_400..34_200).contains(&s) && u < 0.25 {
        r.customer = Some(100_007);
        r.method = "POST";
        r.path = "/v1/charges".into();
        r.status = 201;
    } else if hour == 14 && u < 0.3 {
        r.ip = [198, 51, 100, 1 + rng.below(200) as u8];
        r.path = format!("/v1/search?q=item{}", rng.below(100_000));
        r.agent = AGENTS[1];
    } else if u < 0.33 && rng.unit() < 0.06 {
        r.customer = Some(100_042);
        r.path = "/v1/balance".into();
    } else {
        // Zipf-like popularity: a few customers make most of the traffic.
        let c = 100_000 + (CUSTOMERS as f64 * rng.unit().powf(2.5)) as u64;
        r.customer = Some(c);
        let x = rng.below(100);
        (r.method, r.path, r.status) = match x {
            0..=39 => (
                "GET",
                format!("/v1/customers/{}", rng.below(1_000_000)),
                200,
            ),
            40..=59 => (
                "GET",
                format!("/v1/search?q=item{}", rng.below(100_000)),
                200,
            ),
            60..=74 => ("POST", "/v1/charges".into(), 201),
            75..=89 => ("GET", "/v1/balance".into(), 200),
            90..=94 => ("POST", "/v1/login".into(), 200),
            _ => {
                r.customer = None;
                ("GET", "/health".into(), 200)
            }
        };
        if rng.below(100) == 0 {
            r.status = 404;
        }
    }
    if let Some(c) = r.customer {
        r.ip = address(c);
    }
    r
}

/// The share of the day's lines in minute `m` (a daily cycle: 4x more at 16:00 than at 04:00).
fn weight(m: u64) -> f64 {
    let x = (m as f64 / 1440.0 - 16.0 / 24.0) * std::f64::consts::TAU;
    1.0 + 0.6 * x.cos()
}

/// Writes `n` lines of `format` (auto: combined) to standard output.
pub fn run(n: u64, format: Format, seed: u64) -> crate::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let total: f64 = (0..1440).map(weight).sum();
    let mut rng = Rng(seed);
    let mut line = Vec::with_capacity(512);
    let mut written = 0u64;
    if format == Format::Csv {
        out.write_all(b"timestamp,ip,customer,method,path,status,bytes\n")?;
    }
    for m in 0..1440u64 {
        let end = if m == 1439 {
            n
        } else {
            (n as f64 * (0..=m).map(weight).sum::<f64>() / total).round() as u64
        };
        let k = end.saturating_sub(written);
        for j in 0..k {
            // Stratified in the minute: in time order.
            let at = (j as f64 + rng.unit()) / k as f64 * 60e9;
            let s = m * 60 + (at / 1e9) as u64;
            let mut r = request(&mut rng, s);
            r.nanos = (at % 1e9) as u32;
            line.clear();
            write_line(&mut line, format, &r);
            out.write_all(&line)?;
        }
        written += k;
    }
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

fn iso(r: &Req, digits: usize) -> String {
    let (y, mo, d) = civil_from_days((r.secs / 86_400) as i64);
    let t = r.secs % 86_400;
    let frac = format!("{:09}", r.nanos);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{}Z",
        t / 3600,
        t / 60 % 60,
        t % 60,
        &frac[..digits]
    )
}

fn write_line(o: &mut Vec<u8>, format: Format, r: &Req) {
    let [a, b, c, d] = r.ip;
    let ip = format!("{a}.{b}.{c}.{d}");
    let cust = r.customer.map_or("-".to_string(), |c| c.to_string());
    let _ = match format {
        Format::Auto | Format::Combined | Format::Common => {
            let _ = write!(o, "{ip} - {cust} [");
            format_clf(r.secs, o);
            let tail = if format == Format::Common {
                String::new()
            } else {
                format!(" \"-\" \"{}\"", r.agent)
            };
            writeln!(o, "] \"{} {} HTTP/1.1\" {} {}{tail}", r.method, r.path, r.status, r.bytes)
        }
        Format::Envoy => writeln!(
            o,
            "[{}] \"{} {} HTTP/1.1\" {} - 0 {} 3 2 \"{ip}\" \"{}\" \"{:016x}\" \"api.example.com\" \"10.0.0.7:8080\"",
            iso(r, 3), r.method, r.path, r.status, r.bytes, r.agent, r.secs ^ r.nanos as u64
        ),
        Format::Alb => writeln!(
            o,
            "https {} app/api/50dc6c495c0c9188 {ip}:{} 10.0.0.7:8080 0.000 0.003 0.000 {} {} 310 {} \"{} https://api.example.com:443{} HTTP/1.1\" \"{}\" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/api/73e2d6bc24d8a067 \"Root=1-65e5{:08x}\" \"api.example.com\" \"-\" 0 {} \"forward\" \"-\" \"-\" \"10.0.0.7:8080\" \"{}\" \"-\" \"-\"",
            iso(r, 6), r.port, r.status, r.status, r.bytes, r.method, r.path, r.agent, r.nanos,
            iso(r, 6), r.status
        ),
        Format::Csv => writeln!(
            o,
            "{},{ip},{},{},\"{}\",{},{}",
            iso(r, 3), r.customer.map_or(String::new(), |c| c.to_string()), r.method, r.path,
            r.status, r.bytes
        ),
        Format::Jsonl | Format::EnvoyJson => {
            let v = serde_json::json!({
                "start_time": iso(r, 3), "method": r.method, "path": r.path,
                "response_code": r.status, "bytes_sent": r.bytes, "x_forwarded_for": ip,
                "user_agent": r.agent, "customer_id": r.customer,
            });
            writeln!(o, "{v}")
        }
    };
}
