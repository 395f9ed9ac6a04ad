//! `bench --plot FILE`: checks/s against key count (1k to 10M, uniform) and threads, for
//! turnstile (single checks and `check_batch`) and governor's keyed limiter, drawn as an SVG
//! with plotters. The figure in `docs/perf/` is made by this mode. Also `bench scale --plot`'s
//! figure: CPU-ns per check against keys, each engine beside the floor.

use super::keys::{self, Distribution};
use super::limits::{governor_quota, store_capacity, throughput_limit};
use super::report::print_table;
use super::row::{Row, RowSpec};
use super::run::{GovernorKeyed, Mode, Timer, TurnstileKeyed};
use super::suite::{sequences, Runner, SEQ_LEN};
use super::text::{fmt_count, fmt_rate, load_warning, progress};
use plotters::prelude::*;
use std::time::Duration;
use turnstile::keyed::Store;
use turnstile::{Algorithm, Limits};

/// Key counts swept.
const KEYS: [u64; 5] = [1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// turnstile's store and governor's keyed limiter, each holding keys `0..n`.
fn filled(
    limits: &Limits,
    a: Algorithm,
    n: u64,
) -> crate::Result<(Store, governor::DefaultKeyedRateLimiter<u64>)> {
    let store = Store::builder(limits.clone())
        .capacity(store_capacity(a, n))
        .seed(0x7475_726e)
        .build()?;
    let gov = governor::RateLimiter::keyed(governor_quota());
    for r in 0..n {
        store.check(&keys::key_id(r), 1);
        let _ = gov.check_key(&keys::key_id(r));
    }
    Ok((store, gov))
}

/// Runs the sweep and writes `file`.
pub fn run(
    file: &str,
    a: Algorithm,
    threads: &[usize],
    seconds: f64,
    batch: usize,
    json: bool,
) -> crate::Result<()> {
    load_warning();
    let timer = Timer::calibrate();
    let limits = Limits::new(vec![throughput_limit(a)?])?;
    let max_t = *threads.iter().max().expect("at least one");
    let (warm, win) = (
        Duration::from_secs_f64(seconds / 10.0),
        Duration::from_secs_f64(seconds),
    );
    let mut rows: Vec<Row> = Vec::new();
    for &n in &KEYS {
        progress(format!(
            "{} keys: building and filling both engines",
            fmt_count(n)
        ));
        let (store, gov) = filled(&limits, a, n)?;
        let seq = sequences(Distribution::Uniform, n, max_t, SEQ_LEN);
        for &t in threads {
            let spec = |engine, alg: &str, mode| RowSpec {
                engine,
                algorithm: alg.to_string(),
                keys: Some(n),
                distribution: "uniform".into(),
                threads: t,
                mode,
            };
            let label = |e: &str| format!("{} uniform, {e}, {t} thread(s)", fmt_count(n));
            let r = Runner {
                seq: &seq,
                len: SEQ_LEN,
                timer: &timer,
                warmup: warm,
                window: win,
            };
            let c = TurnstileKeyed(&store);
            rows.push(r.row(
                &c,
                spec("turnstile", a.name(), Mode::Single),
                &label("turnstile"),
            ));
            if batch > 0 {
                let m = Mode::Batch(batch);
                rows.push(r.row(
                    &c,
                    spec("turnstile", a.name(), m),
                    &label("turnstile batch"),
                ));
            }
            let g = GovernorKeyed(&gov);
            rows.push(r.row(
                &g,
                spec("governor", "gcra", Mode::Single),
                &label("governor"),
            ));
        }
    }
    draw(file, a, &rows).map_err(|e| format!("cannot write the plot to {file}: {e}"))?;
    progress(format!("wrote {file}"));
    if json {
        let doc = serde_json::json!({ "results": rows });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serializable")
        );
    } else {
        print_table(&rows, &[]);
    }
    Ok(())
}

fn draw(file: &str, a: Algorithm, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(file, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let ymax = rows
        .iter()
        .map(|r| r.cpu_checks_per_sec)
        .fold(1e6, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("checks/s against keys (uniform keys, turnstile {a} vs governor keyed)"),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d((500f64..2e7).log_scale(), 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_desc("keys in the store")
        .y_desc("checks per CPU-second (all threads)")
        .x_label_formatter(&|x| fmt_count(*x as u64))
        .y_label_formatter(&|y| fmt_rate(*y))
        .draw()?;
    // (legend, points, colour, threads)
    type Series = (String, Vec<(f64, f64)>, RGBColor, usize);
    let mut series: Vec<Series> = Vec::new();
    for r in rows {
        let name = match r.mode {
            "batch" => format!("{} batch {}, {} thr", r.engine, r.batch, r.threads),
            _ => format!("{}, {} thr", r.engine, r.threads),
        };
        let p = (r.keys.unwrap_or(1) as f64, r.cpu_checks_per_sec);
        match series.iter_mut().find(|s| s.0 == name) {
            Some(s) => s.1.push(p),
            None => {
                let color = match (r.engine, r.mode) {
                    ("governor", _) => RGBColor(200, 40, 40),
                    (_, "batch") => RGBColor(30, 140, 60),
                    _ => RGBColor(30, 80, 200),
                };
                series.push((name, vec![p], color, r.threads));
            }
        }
    }
    for (name, pts, color, threads) in series {
        let style = ShapeStyle {
            color: color.mix(if threads > 1 { 1.0 } else { 0.55 }),
            filled: true,
            stroke_width: if threads > 1 { 3 } else { 2 },
        };
        chart
            .draw_series(LineSeries::new(pts.clone(), style))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, style)))?;
    }
    crate::soak::plot::legend(&mut chart)?;
    root.present()?;
    Ok(())
}

/// `bench scale --plot FILE`: CPU-ns per check against keys, both on log scales, for each
/// engine and mode and the floors beside them; uniform keys in full colour, Zipf lighter.
pub(crate) fn scale(
    file: &str,
    rows: &[Row],
    floors: &[super::floor::FloorRow],
) -> Result<(), Box<dyn std::error::Error>> {
    let series = scale_series(rows, floors);
    let all = series.iter().flat_map(|s| s.1.iter());
    let (xmax, ymin, ymax) = all.fold((1e3f64, f64::MAX, 1f64), |(x, lo, hi), p| {
        (x.max(p.0), lo.min(p.1), hi.max(p.1))
    });
    let root = SVGBackend::new(file, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "CPU-ns per check against keys (1 thread; uniform full, Zipf light)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (500f64..xmax * 2.0).log_scale(),
            ((ymin / 1.5).max(0.5)..ymax * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("keys in the store")
        .y_desc("CPU-ns per check (floor: per access)")
        .x_label_formatter(&|x| fmt_count(*x as u64))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for (name, pts, color, zipf) in series {
        let style = ShapeStyle {
            color: color.mix(if zipf { 0.4 } else { 1.0 }),
            filled: true,
            stroke_width: if zipf { 1 } else { 2 },
        };
        chart
            .draw_series(LineSeries::new(pts.clone(), style))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, style)))?;
    }
    // Upper left: the curves rise to the right, where the large sizes are.
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// A line of the scale plot: legend, points, colour, and whether it is a Zipf line.
type ScaleSeries = (String, Vec<(f64, f64)>, RGBColor, bool);

/// The scale plot's lines: each engine and mode, each floor, per distribution.
fn scale_series(rows: &[Row], floors: &[super::floor::FloorRow]) -> Vec<ScaleSeries> {
    // (legend, points, colour, Zipf)
    let mut series: Vec<ScaleSeries> = Vec::new();
    let mut add = |name: String, p: (f64, f64), color: RGBColor, zipf: bool| match series
        .iter_mut()
        .find(|s| s.0 == name)
    {
        Some(s) => s.1.push(p),
        None => series.push((name, vec![p], color, zipf)),
    };
    for r in rows {
        let color = match (r.engine, r.mode) {
            ("governor", _) => RGBColor(200, 40, 40),
            (_, "batch") => RGBColor(30, 140, 60),
            _ => RGBColor(30, 80, 200),
        };
        let mode = match r.mode {
            "batch" => format!(" batch {}", r.batch),
            _ => String::new(),
        };
        let name = format!("{}{mode}, {}", r.engine, r.distribution);
        let p = (r.keys.unwrap_or(1) as f64, r.ns_per_check);
        add(name, p, color, r.distribution != "uniform");
    }
    for f in floors {
        let (what, color) = match f.kind {
            "batch" => (format!("floor batch {}", f.batch), RGBColor(110, 110, 110)),
            _ => ("floor dependent".to_string(), RGBColor(20, 20, 20)),
        };
        let p = (f.keys as f64, f.ns_per_access);
        add(
            format!("{what}, {}", f.distribution),
            p,
            color,
            f.distribution != "uniform",
        );
    }
    series
}
