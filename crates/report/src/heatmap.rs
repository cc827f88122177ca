//! buddyinfo as a heatmap: one row per order (0 at the bottom), one column per sample, the colour
//! the free pages in blocks of that order (blocks × 2^order) on a log scale. Phases are marked along
//! the top and as lines through the map; stretches without a sample (the fragment phase lies between
//! the baseline and the first background sample) are hatched.

use std::fmt::Write;

use super::svg::{esc, fmt_num, viridis, Band, Chart, LogColour, Scale, ZERO_COLOUR};

/// One zone's columns: (time, free blocks per order).
pub struct ZoneSeries {
    /// `Normal`, or `Node 1 Normal` on a machine with more than one node.
    pub label: String,
    pub columns: Vec<(f64, Vec<u64>)>,
}

/// Free pages in blocks of `order`.
pub fn pages(blocks: u64, order: usize) -> f64 {
    blocks as f64 * (1u64 << order.min(63)) as f64
}

/// Each column's extent: halfway to its neighbours, but no wider than the usual sampling interval,
/// so a long gap shows as a gap rather than as a stretched sample.
fn extents(times: &[f64], t_end: f64) -> Vec<(f64, f64)> {
    let mut gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).filter(|d| *d > 0.0).collect();
    gaps.sort_by(f64::total_cmp);
    let typical = gaps.get(gaps.len() / 2).copied().unwrap_or(t_end.max(1e-3) / 50.0);
    let half = typical / 2.0;
    times
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let left = if i == 0 { half } else { ((t - times[i - 1]) / 2.0).min(half) };
            let right = if i + 1 == times.len() { half } else { ((times[i + 1] - t) / 2.0).min(half) };
            ((t - left).max(0.0), (t + right).min(t_end.max(t)))
        })
        .collect()
}

pub fn render(
    id: &str,
    zone: &ZoneSeries,
    orders: usize,
    colour: LogColour,
    bands: &[Band],
    t_end: f64,
) -> String {
    let orders = orders.max(1);
    let mut chart = Chart::new(
        id,
        &format!("zone {} — free pages in blocks of each order (log colour)", zone.label),
        Scale::Linear { min: 0.0, max: t_end },
        Scale::Linear { min: -0.5, max: orders as f64 - 0.5 },
        "seconds since the run started",
        "order",
    );
    chart.height = chart.top + chart.bottom + 17.0 * orders as f64;
    chart.y_categories = Some((0..orders).map(|o| o.to_string()).collect());
    chart.bands(bands);
    let (l, t, pw, ph) = (chart.left, chart.top, chart.plot_w(), chart.plot_h());
    let row_h = ph / orders as f64;

    // Not sampled: hatched under the cells.
    let hatch = format!("hatch-{id}");
    let mut o = format!(
        r##"<defs><pattern id="{hatch}" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#f3f3f3"/><line x1="0" y1="0" x2="0" y2="6" stroke="#c8c8c8" stroke-width="2"/></pattern></defs><rect class="not-sampled" x="{l:.1}" y="{t:.1}" width="{pw:.1}" height="{ph:.1}" fill="url(#{hatch})"/>"##
    );
    // More samples than pixels (a long run): at most one column per pixel.
    let mut cols: Vec<&(f64, Vec<u64>)> = Vec::new();
    let mut last_px = f64::NEG_INFINITY;
    for c in &zone.columns {
        let x = chart.px(c.0);
        if zone.columns.len() as f64 <= pw || x - last_px >= 1.0 {
            cols.push(c);
            last_px = x;
        }
    }
    let times: Vec<f64> = cols.iter().map(|c| c.0).collect();
    let ext = extents(&times, t_end);
    for order in 0..orders {
        let y = t + (orders - 1 - order) as f64 * row_h;
        let _ = write!(o, r#"<g class="series heat-row" data-series="{} order {order}">"#, esc(&zone.label));
        for (c, (a, b)) in cols.iter().zip(&ext) {
            let blocks = c.1.get(order).copied().unwrap_or(0);
            let p = pages(blocks, order);
            let (x0, x1) = (chart.px(*a), chart.px(*b));
            let _ = write!(
                o,
                r#"<rect x="{x0:.2}" y="{y:.2}" width="{:.2}" height="{:.2}" fill="{}"><title>{} order {order} at {:.1} s: {blocks} free blocks = {} pages</title></rect>"#,
                (x1 - x0).max(0.6),
                row_h + 0.05,
                colour.colour(p),
                esc(&zone.label),
                c.0,
                fmt_num(p)
            );
        }
        o.push_str("</g>");
    }
    // Phase boundaries over the cells.
    for b in bands {
        for edge in [b.start, b.end] {
            let x = chart.px(edge);
            let _ = write!(
                o,
                r##"<line class="phase-edge" data-phase="{}" x1="{x:.1}" x2="{x:.1}" y1="{t:.1}" y2="{:.1}" stroke="#222" stroke-width="1" stroke-dasharray="3 2"/>"##,
                esc(&b.name),
                t + ph
            );
        }
    }
    chart.push_body(&o);
    chart.push_overlay(&legend(id, &colour, l + pw + 16.0, t, ph));
    chart.finish()
}

/// The colour bar: 0, then 1 … max on the log scale, then the not-sampled hatch.
fn legend(id: &str, colour: &LogColour, x: f64, y: f64, h: f64) -> String {
    let grad = format!("grad-{id}");
    let bar_h = (h - 34.0).max(60.0);
    let mut o = format!(
        r##"<g class="colour-legend" font-size="11" fill="#222"><defs><linearGradient id="{grad}" x1="0" y1="1" x2="0" y2="0">"##
    );
    for i in 0..=8 {
        let f = i as f64 / 8.0;
        let _ = write!(o, r#"<stop offset="{f:.3}" stop-color="{}"/>"#, viridis(f));
    }
    let _ = write!(
        o,
        r##"</linearGradient></defs><rect x="{x:.1}" y="{y:.1}" width="14" height="{bar_h:.1}" fill="url(#{grad})" stroke="#888"/>"##
    );
    let mut v = 1.0;
    while v <= colour.max.max(1.0) * 1.0001 {
        let p = colour.position(v);
        let ty = y + bar_h * (1.0 - p);
        let _ = write!(
            o,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{ty:.1}" y2="{ty:.1}" stroke="#222"/><text x="{:.1}" y="{:.1}">{}</text>"##,
            x + 14.0,
            x + 18.0,
            x + 21.0,
            ty + 4.0,
            fmt_num(v)
        );
        v *= 10.0;
    }
    let _ = write!(
        o,
        r##"<text x="{:.1}" y="{:.1}">pages</text><rect x="{x:.1}" y="{:.1}" width="14" height="10" fill="{ZERO_COLOUR}" stroke="#888"/><text x="{:.1}" y="{:.1}">0 free</text><rect x="{:.1}" y="{:.1}" width="14" height="10" fill="url(#hatch-{id})" stroke="#888"/><text x="{:.1}" y="{:.1}">not sampled</text></g>"##,
        x + 60.0,
        y + 10.0,
        y + bar_h + 8.0,
        x + 20.0,
        y + bar_h + 17.0,
        x + 80.0,
        y + bar_h + 8.0,
        x + 100.0,
        y + bar_h + 17.0
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_gap_is_not_filled_by_the_samples_around_it() {
        // Baseline at 0, fragment until 16 s, then samples every 0.5 s.
        let times = [0.0, 16.0, 16.5, 17.0, 17.5];
        let e = extents(&times, 18.0);
        assert_eq!(e[0], (0.0, 0.25));
        assert_eq!(e[1], (15.75, 16.25));
        assert_eq!(e[4], (17.25, 17.75));
    }

    #[test]
    fn one_row_per_order_named_by_zone() {
        let zone =
            ZoneSeries { label: "Normal".into(), columns: vec![(0.0, vec![5, 0, 3]), (1.0, vec![4, 1, 0])] };
        let svg = render("hm-t", &zone, 3, LogColour { max: 20.0 }, &[], 2.0);
        for o in 0..3 {
            assert!(svg.contains(&format!(r#"data-series="Normal order {o}""#)), "{svg}");
        }
        // Order 2 with 3 blocks is 12 pages; order 1 with 0 blocks is white.
        assert!(svg.contains("3 free blocks = 12 pages"));
        assert!(svg.contains(&format!(r#"fill="{ZERO_COLOUR}"><title>Normal order 1 at 0.0 s"#)));
    }
}
