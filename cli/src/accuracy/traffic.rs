//! Deterministic synthetic traffic for `turnstile accuracy`: many sources of three kinds,
//! merged into one stream in time order.
//!
//! Every source has its own small generator (SplitMix64 seeded from `--seed` and the source's
//! number), so a source's requests do not depend on how the others interleave, and the same
//! seed gives the same stream. Rates are in units of the limit: `r = 1` is a source sending
//! exactly `limit` requests per window on average. Two mixes ([`Mix`]):
//!
//! | kind | [`PRODUCTION`] | [`ADVERSARIAL`] |
//! |---|---|---|
//! | steady: Poisson at r, log-normal, at most 30 | 96.9 %, median 0.01, σ = 1.5 (0.11 % above r = 1) | 80 %, median 0.02, σ = 1.5 (0.5 % above 1) |
//! | bursty: Poisson at r_on (log-normal, at most 30) for Exp(on), silent for Exp(off) | 3 %, median 0.1, σ = 1 (1.1 % above 1), on W, off 30 W | 19 %, median 0.25, σ = 1 (8 % above 1), on 2 W, off 15 W |
//! | edge attacker | 0.1 % | 1 % |
//!
//! An edge attacker, at every k-th window edge (k uniform in 2..=8), sends B requests spread
//! uniformly over δ before the edge and B over δ after; B = U(0.5, 1) × limit,
//! δ = U(1 %, 25 %) × W: the fixed window's worst case (up to 2B ≤ 2 × limit pass in 2δ).
//!
//! The stream is merged a slice of time at a time: every source emits its requests before the
//! slice's end, the slice is sorted by (time, source), and handed out in order. The slice's
//! length adapts to hold about [`SLICE`] requests, so memory is O(sources + SLICE), not
//! O(requests), and a request costs a share of one sort instead of a heap pop and push (which
//! was the largest item of a profile).

/// The population of sources: shares of each kind and their rate distributions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mix {
    /// The name `--mix` takes.
    pub name: &'static str,
    /// Share of steady sources.
    pub steady: f64,
    /// Share of bursty sources (the rest are edge attackers).
    pub bursty: f64,
    /// Steady rate: median and σ of its log.
    pub steady_median: f64,
    pub steady_sigma: f64,
    /// Bursty rate while on: median and σ of its log.
    pub bursty_median: f64,
    pub bursty_sigma: f64,
    /// Mean on and off periods of a bursty source, in windows.
    pub on_windows: f64,
    pub off_windows: f64,
}

/// Most sources far below the limit, a few bursty ones, a handful of attackers: the shape of
/// the traffic a rate limit sees in production (docs/accuracy.md says why these figures).
pub const PRODUCTION: Mix = Mix {
    name: "production",
    steady: 0.969,
    bursty: 0.03,
    steady_median: 0.01,
    steady_sigma: 1.5,
    bursty_median: 0.1,
    bursty_sigma: 1.0,
    on_windows: 1.0,
    off_windows: 30.0,
};

/// Built to exercise the threshold: a heavy tail across the limit, many bursters, 1 % edge
/// attackers (4.65 % of requests within 10 % of the limit at the default size).
pub const ADVERSARIAL: Mix = Mix {
    name: "adversarial",
    steady: 0.80,
    bursty: 0.19,
    steady_median: 0.02,
    steady_sigma: 1.5,
    bursty_median: 0.25,
    bursty_sigma: 1.0,
    on_windows: 2.0,
    off_windows: 15.0,
};

/// Every mix, by name.
pub const MIXES: [Mix; 2] = [PRODUCTION, ADVERSARIAL];

/// SplitMix64: a small, fast, well-mixed generator; one per source.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `stream` under `seed`.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [a, b).
    pub fn range(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * (1.0 - self.unit())
    }

    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -self.unit().ln() * mean
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Log-normal with the given median and σ of the log.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }
}

/// The kinds of source, for the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Poisson at a heavy-tailed rate.
    Steady,
    /// Poisson bursts separated by silences.
    Bursty,
    /// Bursts straddling window edges.
    EdgeAttacker,
}

impl Kind {
    /// All kinds, in report order.
    pub const ALL: [Kind; 3] = [Kind::Steady, Kind::Bursty, Kind::EdgeAttacker];

    /// The report name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Steady => "steady",
            Kind::Bursty => "bursty",
            Kind::EdgeAttacker => "edge_attacker",
        }
    }
}

enum Process {
    Poisson {
        gap: f64,
    },
    OnOff {
        gap: f64,
        on: f64,
        off: f64,
        on_until: u64,
    },
    Edge {
        burst: u64,
        spread: u64,
        every: u64,
        next_edge: u64,
        /// The current burst's times, latest first (popped from the back).
        pending: Vec<u64>,
    },
}

struct Source {
    rng: Rng,
    process: Process,
    /// The time of this source's next request.
    next: u64,
}

/// Requests per time slice, about.
pub const SLICE: usize = 1 << 20;

/// The traffic's shape: the limit it is scaled to and where time starts.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Requests per window that r = 1 stands for.
    pub limit: u64,
    /// The window, ns.
    pub window: u64,
    /// The first instant, ns (a window edge).
    pub start: u64,
}

/// The merged stream of `(time ns, source)`.
pub struct Traffic {
    sources: Vec<Source>,
    kinds: Vec<Kind>,
    shape: Shape,
    /// The current slice, `time << 32 | source`, sorted; `pos` is the next one out.
    slice: Vec<u128>,
    pos: usize,
    /// Where the current slice ends, and the next slice's length.
    until: u64,
    step: u64,
}

impl Traffic {
    /// `n` sources of `mix` under `seed`.
    pub fn new(n: u32, seed: u64, shape: Shape, mix: &Mix) -> Self {
        let w = shape.window as f64;
        let l = shape.limit as f64;
        let mut sources = Vec::with_capacity(n as usize);
        let mut kinds = Vec::with_capacity(n as usize);
        for i in 0..n {
            let mut rng = Rng::new(seed, i as u64);
            let pick = rng.unit();
            let (kind, process) = if pick <= mix.steady {
                let r = rng
                    .lognormal(mix.steady_median, mix.steady_sigma)
                    .clamp(1e-3, 30.0);
                (Kind::Steady, Process::Poisson { gap: w / (r * l) })
            } else if pick <= mix.steady + mix.bursty {
                let r = rng
                    .lognormal(mix.bursty_median, mix.bursty_sigma)
                    .clamp(1e-2, 30.0);
                let (on, off) = (mix.on_windows * w, mix.off_windows * w);
                // Start on with the stationary probability, at a random point of the period.
                let on_until = if rng.unit() <= on / (on + off) {
                    shape.start + rng.exp(on) as u64
                } else {
                    shape.start + rng.exp(off) as u64 + rng.exp(on) as u64
                };
                let gap = w / (r * l);
                (
                    Kind::Bursty,
                    Process::OnOff {
                        gap,
                        on,
                        off,
                        on_until,
                    },
                )
            } else {
                let burst = ((rng.range(0.5, 1.0) * l).round() as u64).max(1);
                let spread = ((rng.range(0.01, 0.25) * w) as u64).max(1);
                let every = 2 + rng.next_u64() % 7;
                let first = shape.start + (1 + rng.next_u64() % every) * shape.window;
                (
                    Kind::EdgeAttacker,
                    Process::Edge {
                        burst,
                        spread,
                        every,
                        next_edge: first,
                        pending: Vec::new(),
                    },
                )
            };
            kinds.push(kind);
            let mut s = Source {
                rng,
                process,
                next: 0,
            };
            s.next = s.next_after(shape.start, shape.window);
            sources.push(s);
        }
        Self {
            sources,
            kinds,
            shape,
            slice: Vec::new(),
            pos: 0,
            until: shape.start,
            step: (shape.window / 16).max(1),
        }
    }

    /// Fills the next slice of time.
    fn refill(&mut self) {
        self.slice.clear();
        self.pos = 0;
        let from = self.until;
        self.until = from.saturating_add(self.step);
        let (until, window) = (self.until, self.shape.window);
        for (i, s) in self.sources.iter_mut().enumerate() {
            while s.next < until {
                self.slice.push((s.next as u128) << 32 | i as u128);
                s.next = s.next_after(s.next, window);
            }
        }
        self.slice.sort_unstable();
        // Aim the next slice at SLICE requests, growing at most 4-fold at a time.
        let got = self.slice.len().max(1) as u128;
        let want = self.step as u128 * SLICE as u128 / got;
        self.step = want
            .clamp(1, 4 * self.step as u128)
            .min(u64::MAX as u128 / 4) as u64;
    }

    /// Each source's kind.
    pub fn kinds(&self) -> &[Kind] {
        &self.kinds
    }
}

impl Iterator for Traffic {
    type Item = (u64, u32);

    fn next(&mut self) -> Option<(u64, u32)> {
        while self.pos == self.slice.len() {
            if self.sources.is_empty() {
                return None;
            }
            self.refill();
        }
        let v = self.slice[self.pos];
        self.pos += 1;
        Some(((v >> 32) as u64, v as u32))
    }
}

impl Source {
    /// The source's next request time, at or after `t` (its previous one).
    fn next_after(&mut self, t: u64, window: u64) -> u64 {
        let rng = &mut self.rng;
        match &mut self.process {
            Process::Poisson { gap } => t + rng.exp(*gap) as u64,
            Process::OnOff {
                gap,
                on,
                off,
                on_until,
            } => {
                let mut at = t + rng.exp(*gap) as u64;
                while at > *on_until {
                    // The on period ended first: the next one starts after a silence.
                    let start = *on_until + rng.exp(*off) as u64;
                    *on_until = start + rng.exp(*on) as u64;
                    at = start + rng.exp(*gap) as u64;
                }
                at
            }
            Process::Edge {
                burst,
                spread,
                every,
                next_edge,
                pending,
            } => {
                if pending.is_empty() {
                    let e = *next_edge;
                    for _ in 0..*burst {
                        pending.push(e - 1 - rng.next_u64() % *spread);
                        pending.push(e + rng.next_u64() % *spread);
                    }
                    pending.sort_unstable_by(|a, b| b.cmp(a));
                    *next_edge += *every * window;
                }
                pending.pop().expect("a burst has requests").max(t)
            }
        }
    }
}
