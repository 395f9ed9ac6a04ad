//! `bench serve --plot FILE`: the report's rows as bars.

use super::ServiceRow;
use crate::bench::text::fmt_rate;
use plotters::prelude::*;

/// `bench serve --plot FILE`: each row a horizontal bar of requests/s (turnstile's blue, the
/// peers' grey), its figures written beside it: requests/s and per server CPU-second.
pub(crate) fn bars(
    file: &std::path::Path,
    rows: &[ServiceRow],
) -> Result<(), Box<dyn std::error::Error>> {
    let height = 60 + 28 * rows.len() as u32;
    let root = SVGBackend::new(file, (960, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let xmax = rows.iter().map(|r| r.requests_per_sec).fold(1.0, f64::max) * 1.45;
    let n = rows.len() as f64;
    let label = |r: &ServiceRow| match r.pipeline {
        Some(p) => format!("{} -P {p}", r.label),
        None => r.label.clone(),
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "requests/s, one server core (turnstile bench serve)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(300)
        .build_cartesian_2d(0f64..xmax, -0.5f64..n - 0.5)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(rows.len() + 1)
        .y_label_formatter(&|y| {
            // Row i is centred on y = n - 1 - i, the first at the top.
            let i = n - 1.0 - y;
            let whole = (i - i.round()).abs() < 0.01 && i > -0.5;
            whole
                .then(|| rows.get(i.round() as usize).map(label))
                .flatten()
                .unwrap_or_default()
        })
        .x_label_formatter(&|x| fmt_rate(*x))
        .draw()?;
    for (i, r) in rows.iter().enumerate() {
        let mid = n - 1.0 - i as f64;
        let color = if r.label.starts_with("turnstile") {
            RGBColor(43, 108, 176)
        } else {
            RGBColor(160, 174, 192)
        };
        let bar = Rectangle::new(
            [(0.0, mid - 0.35), (r.requests_per_sec, mid + 0.35)],
            color.filled(),
        );
        chart.draw_series(std::iter::once(bar))?;
        let text = format!(
            "{}/s ({} per CPU-s)",
            fmt_rate(r.requests_per_sec),
            fmt_rate(r.per_server_cpu_sec)
        );
        chart.draw_series(std::iter::once(Text::new(
            text,
            (r.requests_per_sec + xmax * 0.01, mid + 0.15),
            ("sans-serif", 12),
        )))?;
    }
    root.present()?;
    Ok(())
}
