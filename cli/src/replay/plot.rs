//! `--plot FILE`: the replay over time as an SVG, drawn with plotters as `bench --plot` and
//! `soak --plot` are: above, the traffic per minute (requests, and those admitted); below,
//! the denials per minute of the rules that denied most (a shadow rule's would-be denials
//! dashed).

use super::tally::{Tally, COL_DENIED, COL_REQUESTS, COL_RULES};
use super::time::format_iso;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::error::Error;
use std::path::Path;

/// Rules drawn (the most denying).
const RULES: usize = 6;
const COLORS: [RGBColor; RULES] = [
    RGBColor(200, 40, 40),
    RGBColor(30, 80, 200),
    RGBColor(30, 140, 60),
    RGBColor(200, 120, 0),
    RGBColor(120, 40, 160),
    RGBColor(0, 140, 150),
];

/// A line of a panel.
struct Line {
    name: String,
    points: Vec<(f64, f64)>,
    color: RGBColor,
    width: u32,
    dashed: bool,
}

/// Draws `t`'s series into `file`.
pub fn draw(file: &Path, t: &Tally, title: &str) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(file, (960, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(330);
    let rows: Vec<(u64, Vec<u64>)> = t.series.rows().map(|(s, c)| (s, c.to_vec())).collect();
    let per_min = t.series.width() as f64 / 60e9;
    let t0 = rows.first().map_or(0, |r| r.0);
    let x = |s: u64| (s - t0) as f64 / 3600e9;
    let x_max = rows.last().map_or(0.0, |r| x(r.0)).max(per_min / 60.0);
    let label = move |h: &f64| {
        let s = format_iso(t0 + (*h * 3600e9) as u64);
        s[5..16].replace('T', " ")
    };
    let rate = |f: &dyn Fn(&[u64]) -> u64| -> Vec<(f64, f64)> {
        rows.iter()
            .map(|(s, c)| (x(*s), f(c) as f64 / per_min))
            .collect()
    };
    let traffic = vec![
        Line {
            name: "requests".into(),
            points: rate(&|c| c[COL_REQUESTS]),
            color: RGBColor(120, 120, 120),
            width: 2,
            dashed: false,
        },
        Line {
            name: "admitted".into(),
            points: rate(&|c| c[COL_REQUESTS] - c[COL_DENIED]),
            color: RGBColor(30, 80, 200),
            width: 1,
            dashed: false,
        },
    ];
    let mut ranked: Vec<usize> = (0..t.rules.len())
        .filter(|&i| t.rules[i].denied + t.rules[i].would_deny > 0)
        .collect();
    ranked.sort_by_key(|&i| std::cmp::Reverse(t.rules[i].denied + t.rules[i].would_deny));
    ranked.truncate(RULES);
    let denials: Vec<Line> = ranked
        .iter()
        .enumerate()
        .map(|(k, &i)| Line {
            name: format!("{} ({})", t.rules[i].name, t.rules[i].mode.name()),
            points: rate(&|c| c[COL_RULES + i]),
            color: COLORS[k],
            width: 2,
            dashed: t.rules[i].would_deny > 0,
        })
        .collect();
    let unit = if per_min > 1.0 {
        format!(", buckets of {per_min:.0} min")
    } else {
        String::new()
    };
    let caption = format!("{title}: requests per minute{unit} (UTC)");
    panel(&top, &caption, x_max, &label, &traffic)?;
    let caption = "denials per minute by rule (shadow rules: would-be denials, dashed)";
    panel(&bottom, caption, x_max, &label, &denials)?;
    root.present()?;
    Ok(())
}

/// One panel: time (hours from the first bucket, labelled as UTC times) against a rate.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    x_max: f64,
    label: &dyn Fn(&f64) -> String,
    lines: &[Line],
) -> Result<(), Box<dyn Error>> {
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_labels(8)
        .x_label_formatter(label)
        .y_label_formatter(&|y| super::report::thousands(*y as u64))
        .y_desc("per minute")
        .draw()?;
    for l in lines {
        let style = l.color.stroke_width(l.width);
        let pts = l.points.clone();
        let anno = if l.dashed {
            chart.draw_series(DashedLineSeries::new(pts, 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(pts, style))?
        };
        anno.label(l.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    if !lines.is_empty() {
        crate::soak::plot::legend(&mut chart)?;
    }
    Ok(())
}
