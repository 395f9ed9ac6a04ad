//! `soak --plot FILE`: the server's resident memory (and its RESP buffers) and the honest
//! clients' p99 over time, the attack's start and end marked, drawn as an SVG with plotters.

use super::{mib, Sample};
use plotters::prelude::*;
use std::path::Path;

/// Draws `samples` into `file`; `marks` are the attack's start and end (s), `idle` the idle
/// RSS.
pub fn draw(
    file: &Path,
    samples: &[Sample],
    marks: [f64; 2],
    idle: Option<u64>,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(file, (960, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    let t_max = samples.iter().map(|s| s.t).fold(1.0, f64::max);
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
    let mut chart = ChartBuilder::on(&top)
        .caption(
            "turnstile soak: server memory (attack between the dashed lines)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("MiB")
        .draw()?;
    for x in marks {
        chart.draw_series(DashedLineSeries::new(
            [(x, 0.0), (x, y_max)],
            6,
            4,
            BLACK.stroke_width(1),
        ))?;
    }
    if let Some(i) = idle {
        let band = mib(i) * 1.1;
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, band), (t_max, band)],
                3,
                3,
                RGBColor(120, 120, 120).stroke_width(1),
            ))?
            .label("idle + 10 %")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], RGBColor(120, 120, 120)));
    }
    let blue = RGBColor(30, 80, 200);
    chart
        .draw_series(LineSeries::new(rss, blue.stroke_width(2)))?
        .label("server RSS (VmRSS)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], blue.stroke_width(2)));
    let green = RGBColor(30, 140, 60);
    chart
        .draw_series(LineSeries::new(buffers, green.stroke_width(2)))?
        .label("RESP buffers + deferred (metrics)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], green.stroke_width(2)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;

    let resp: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t, s.p99_resp_ms?)))
        .collect();
    let http: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t, s.p99_http_ms?)))
        .collect();
    let l_max = resp
        .iter()
        .chain(&http)
        .map(|p| p.1)
        .fold(super::MAX_P99_MS, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&bottom)
        .caption("honest clients: p99 per half second", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..l_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("ms")
        .draw()?;
    for x in marks {
        chart.draw_series(DashedLineSeries::new(
            [(x, 0.0), (x, l_max)],
            6,
            4,
            BLACK.stroke_width(1),
        ))?;
    }
    let red = RGBColor(200, 40, 40);
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, super::MAX_P99_MS), (t_max, super::MAX_P99_MS)],
            3,
            3,
            red.stroke_width(1),
        ))?
        .label("target 10 ms")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], red));
    chart
        .draw_series(LineSeries::new(resp, blue.stroke_width(2)))?
        .label("CL.THROTTLE p99")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], blue.stroke_width(2)));
    let orange = RGBColor(230, 130, 20);
    chart
        .draw_series(LineSeries::new(http, orange.stroke_width(2)))?
        .label("POST /v1/check p99")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], orange.stroke_width(2)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
