//! `soak --plot FILE`: the server's resident memory (and its RESP buffers), the honest
//! clients' p99 per protocol, the server's open descriptors and its log's lines per second
//! over time, the attack's start and end marked and each target drawn as a line, as an SVG
//! with plotters.

use super::{mib, Sample};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::error::Error;
use std::path::Path;

/// A chart of seconds against a linear figure.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

const BLUE: RGBColor = RGBColor(30, 80, 200);
const GREY: RGBColor = RGBColor(120, 120, 120);

/// Draws `samples` into `file`; `marks` are the attack's start and end (s), `idle` the idle
/// RSS and descriptors.
pub fn draw(
    file: &Path,
    samples: &[Sample],
    marks: [f64; 2],
    idle: [Option<u64>; 2],
) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(file, (960, 1180)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, rest) = root.split_vertically(400);
    let (middle, rest) = rest.split_vertically(320);
    let (fds, log) = rest.split_vertically(230);
    let t_max = samples.iter().map(|s| s.t).fold(1.0, f64::max);
    memory(&top, samples, marks, idle[0], t_max)?;
    latency(&middle, samples, marks, t_max)?;
    descriptors(&fds, samples, marks, idle[1], t_max)?;
    log_rate(&log, samples, marks, t_max)?;
    root.present()?;
    Ok(())
}

/// The server's open descriptors, the idle count as a line.
fn descriptors(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    samples: &[Sample],
    marks: [f64; 2],
    idle: Option<u64>,
    t_max: f64,
) -> Result<(), Box<dyn Error>> {
    let fds: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t, s.fds? as f64)))
        .collect();
    let y_max = fds.iter().map(|p| p.1).fold(16.0, f64::max) * 1.15;
    let caption = "server: open descriptors (/proc/PID/fd)";
    let mut chart = chart(area, caption, "descriptors", t_max, y_max, marks)?;
    if let Some(i) = idle {
        threshold(
            &mut chart,
            i as f64,
            t_max,
            GREY,
            "idle (target after the settle)",
        )?;
    }
    line(&mut chart, fds, BLUE, "descriptors")?;
    legend(&mut chart)
}

/// The server log's lines per second (all kinds), the per-kind target as a line.
fn log_rate(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    samples: &[Sample],
    marks: [f64; 2],
    t_max: f64,
) -> Result<(), Box<dyn Error>> {
    let rate: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t, s.log_lines_per_s?)))
        .collect();
    let limit = super::MAX_LOG_PER_SECOND as f64;
    let y_max = rate.iter().map(|p| p.1).fold(limit * 2.0, f64::max) * 1.15;
    let caption = "server log: lines per second (all kinds of message)";
    let mut chart = chart(area, caption, "lines/s", t_max, y_max, marks)?;
    let red = RGBColor(200, 40, 40);
    threshold(&mut chart, limit, t_max, red, "target: 10/s per kind")?;
    line(&mut chart, rate, BLUE, "log lines/s (--server-log)")?;
    legend(&mut chart)
}

/// The server's RSS and its RESP buffers over time, the idle RSS + 10 % as a line.
fn memory(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    samples: &[Sample],
    marks: [f64; 2],
    idle: Option<u64>,
    t_max: f64,
) -> Result<(), Box<dyn Error>> {
    let rss: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t, mib(s.rss?))))
        .collect();
    let buffers: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| {
            Some((
                s.t,
                (s.buffers? + s.deferred.unwrap_or(0.0)) / (1 << 20) as f64,
            ))
        })
        .collect();
    let y_max = rss.iter().chain(&buffers).map(|p| p.1).fold(16.0, f64::max) * 1.15;
    let caption = "turnstile soak: server memory (attack between the dashed lines)";
    let mut chart = chart(area, caption, "MiB", t_max, y_max, marks)?;
    if let Some(i) = idle {
        threshold(&mut chart, mib(i) * 1.1, t_max, GREY, "idle + 10 %")?;
    }
    line(&mut chart, rss, BLUE, "server RSS (VmRSS)")?;
    let green = RGBColor(30, 140, 60);
    line(
        &mut chart,
        buffers,
        green,
        "RESP buffers + deferred (metrics)",
    )?;
    legend(&mut chart)
}

/// The honest clients' p99 per sample, the target as a line.
fn latency(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    samples: &[Sample],
    marks: [f64; 2],
    t_max: f64,
) -> Result<(), Box<dyn Error>> {
    let resp: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t, s.p99_resp_ms?)))
        .collect();
    let http: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t, s.p99_http_ms?)))
        .collect();
    let grpc: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t, s.p99_grpc_ms?)))
        .collect();
    let l_max = resp
        .iter()
        .chain(&http)
        .chain(&grpc)
        .map(|p| p.1)
        .fold(super::MAX_P99_MS, f64::max)
        * 1.15;
    let caption = "honest clients: p99 per half second";
    let mut chart = chart(area, caption, "ms", t_max, l_max, marks)?;
    let red = RGBColor(200, 40, 40);
    threshold(&mut chart, super::MAX_P99_MS, t_max, red, "target 10 ms")?;
    line(&mut chart, resp, BLUE, "CL.THROTTLE p99")?;
    let orange = RGBColor(230, 130, 20);
    line(&mut chart, http, orange, "POST /v1/check p99")?;
    let purple = RGBColor(130, 50, 170);
    line(&mut chart, grpc, purple, "gRPC ShouldRateLimit p99")?;
    legend(&mut chart)
}

/// A chart of 0..`t_max` seconds against 0..`y_max` in `unit`, its mesh drawn and `marks`
/// (seconds) as dashed vertical lines.
fn chart<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    caption: &str,
    unit: &str,
    t_max: f64,
    y_max: f64,
    marks: [f64; 2],
) -> Result<Chart<'a, 'b>, Box<dyn Error>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(unit)
        .draw()?;
    for x in marks {
        chart.draw_series(DashedLineSeries::new(
            [(x, 0.0), (x, y_max)],
            6,
            4,
            BLACK.stroke_width(1),
        ))?;
    }
    Ok(chart)
}

/// A labelled dashed horizontal line at `y`.
fn threshold(
    chart: &mut Chart<'_, '_>,
    y: f64,
    t_max: f64,
    color: RGBColor,
    label: &str,
) -> Result<(), Box<dyn Error>> {
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, y), (t_max, y)],
            3,
            3,
            color.stroke_width(1),
        ))?
        .label(label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
    Ok(())
}

/// A labelled line of `points`.
fn line(
    chart: &mut Chart<'_, '_>,
    points: Vec<(f64, f64)>,
    color: RGBColor,
    label: &str,
) -> Result<(), Box<dyn Error>> {
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    Ok(())
}

/// The chart's legend, upper right on a light box (the soak's and the benchmarks' plots).
pub(crate) fn legend<'a, DB, CT>(chart: &mut ChartContext<'a, DB, CT>) -> Result<(), Box<dyn Error>>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}
