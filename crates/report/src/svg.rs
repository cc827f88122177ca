//! Hand-written SVG: a line/point chart with axes, ticks, phase bands and a legend, and the colour
//! scales the report uses. Every series is a `<g class="series" data-series="…">`, so a reader (or a
//! test) can find it by name; hover titles (`<title>`) carry the exact numbers without any script.
//!
//! The output is well-formed XML (the whole report is), so it can be parsed by an XML parser as well
//! as by a browser.

use std::fmt::Write;

/// Escape text for XML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0 at all.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// Tableau 10: distinguishable, and readable on white.
pub const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
    "#bab0ac",
];

pub fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Dash patterns for a second distinction within one colour (percentiles, A/B sides).
pub const DASHES: [&str; 5] = ["", "6 3", "2 3", "10 3 2 3", "1 2"];

pub fn dash(i: usize) -> &'static str {
    DASHES[i % DASHES.len()]
}

/// Viridis at nine stops; `t` in [0, 1].
pub fn viridis(t: f64) -> String {
    const STOPS: [(u8, u8, u8); 9] = [
        (68, 1, 84),
        (71, 44, 122),
        (59, 81, 139),
        (44, 113, 142),
        (33, 144, 141),
        (39, 173, 129),
        (92, 200, 99),
        (170, 220, 50),
        (253, 231, 37),
    ];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
    let pos = t * (STOPS.len() - 1) as f64;
    let i = (pos.floor() as usize).min(STOPS.len() - 2);
    let f = pos - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |x: u8, y: u8| (x as f64 + (y as f64 - x as f64) * f).round() as u8;
    format!("#{:02x}{:02x}{:02x}", mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// A log colour scale for counts: 0 is its own colour, 1..=max map onto viridis by log(1+v).
#[derive(Clone, Copy, Debug)]
pub struct LogColour {
    pub max: f64,
}

/// The colour of a cell with nothing in it.
pub const ZERO_COLOUR: &str = "#ffffff";

impl LogColour {
    /// Position of `v` on the scale, 0..=1 (0 for 0).
    pub fn position(&self, v: f64) -> f64 {
        if v <= 0.0 || self.max <= 0.0 {
            return 0.0;
        }
        (v.ln_1p() / self.max.ln_1p()).clamp(0.0, 1.0)
    }

    pub fn colour(&self, v: f64) -> String {
        if v <= 0.0 {
            ZERO_COLOUR.to_string()
        } else {
            viridis(self.position(v))
        }
    }
}

/// How values map onto an axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    Linear {
        min: f64,
        max: f64,
    },
    /// Base-10 log; `min` > 0.
    Log {
        min: f64,
        max: f64,
    },
}

impl Scale {
    /// Linear over the data with a little headroom; `zero` pins the lower end at 0 when the data
    /// are all non-negative.
    pub fn linear(values: impl IntoIterator<Item = f64>, zero: bool) -> Scale {
        let (mut lo, mut hi) = bounds(values).unwrap_or((0.0, 1.0));
        if zero && lo >= 0.0 {
            lo = 0.0;
        }
        if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
            // One value: centre it.
            let pad = if hi == 0.0 { 1.0 } else { hi.abs() * 0.5 };
            if !(zero && lo == 0.0) {
                lo -= pad;
            }
            hi += pad;
        } else {
            hi += (hi - lo) * 0.05;
        }
        Scale::Linear { min: lo, max: hi }
    }

    /// Log over the positive data, widened to whole decades.
    pub fn log(values: impl IntoIterator<Item = f64>) -> Scale {
        let (lo, hi) = bounds(values.into_iter().filter(|v| *v > 0.0)).unwrap_or((1.0, 10.0));
        let lo = 10f64.powf(lo.log10().floor());
        let mut hi = 10f64.powf(hi.log10().ceil());
        if hi <= lo {
            hi = lo * 10.0;
        }
        Scale::Log { min: lo, max: hi }
    }

    /// Position in [0, 1] (outside when `v` is out of range).
    pub fn norm(&self, v: f64) -> f64 {
        match *self {
            Scale::Linear { min, max } => (v - min) / (max - min),
            Scale::Log { min, max } => {
                let v = v.max(min * 1e-3);
                (v.log10() - min.log10()) / (max.log10() - min.log10())
            }
        }
    }

    /// Tick values with labels.
    pub fn ticks(&self, fmt: &dyn Fn(f64) -> String) -> Vec<(f64, String)> {
        match *self {
            Scale::Linear { min, max } => nice_ticks(min, max, 6).into_iter().map(|v| (v, fmt(v))).collect(),
            Scale::Log { min, max } => {
                // Decades; with two decades or fewer also 2× and 5×.
                let steps: &[f64] = if max / min <= 100.0 * 1.0001 { &[1.0, 2.0, 5.0] } else { &[1.0] };
                let mut decade = 10f64.powf(min.log10().floor());
                let mut out = Vec::new();
                while decade <= max * 1.0001 {
                    for s in steps {
                        let v = decade * s;
                        if v >= min * 0.9999 && v <= max * 1.0001 {
                            out.push((v, fmt(v)));
                        }
                    }
                    decade *= 10.0;
                }
                out
            }
        }
    }
}

fn bounds(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values.into_iter().filter(|v| v.is_finite()).fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

/// About `n` round tick values covering [min, max].
pub fn nice_ticks(min: f64, max: f64, n: usize) -> Vec<f64> {
    if max.is_nan() || min.is_nan() || max <= min {
        return vec![min];
    }
    let raw = (max - min) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let mut v = (min / step).ceil() * step;
    let mut out = Vec::new();
    while v <= max + step * 1e-9 {
        // -0.0 and 1e-17 print badly.
        out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
        v += step;
    }
    out
}

/// A number for a tick or a table: 3 significant digits, k/M/G above 10⁴.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    let (x, suffix) = if a >= 1e10 {
        (v / 1e9, "G")
    } else if a >= 1e7 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let ax = x.abs();
    let s = if ax == 0.0 {
        "0".to_string()
    } else if ax >= 100.0 || (x.fract() == 0.0 && ax < 1e4) {
        format!("{x:.0}")
    } else if ax >= 10.0 {
        format!("{x:.1}")
    } else if ax >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    };
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    format!("{s}{suffix}")
}

/// A vertical band on a time axis: a run phase.
#[derive(Clone, Debug)]
pub struct Band {
    /// `data-phase`: `fragment`, `workloads`, `release`, ...
    pub name: String,
    pub start: f64,
    pub end: f64,
    /// Hover text.
    pub title: String,
    pub fill: &'static str,
    /// Thin marks inside the band (one per workload phase), with hover text.
    pub marks: Vec<(f64, String)>,
}

/// One legend entry.
struct LegendEntry {
    name: String,
    colour: String,
    dash: String,
    marker: bool,
}

/// A chart: axes, grid, bands, series, legend. Coordinates are in data units; `finish` wraps it all
/// in one `<svg>`.
pub struct Chart {
    pub width: f64,
    pub height: f64,
    pub left: f64,
    pub right: f64,
    pub top: f64,
    pub bottom: f64,
    pub x: Scale,
    pub y: Scale,
    pub x_label: String,
    pub y_label: String,
    /// x ticks (value, label) instead of round numbers: the sweep's own values, or categories at
    /// positions 0, 1, ...
    pub x_ticks: Option<Vec<(f64, String)>>,
    /// The same for the y axis.
    pub y_categories: Option<Vec<String>>,
    pub x_fmt: fn(f64) -> String,
    pub y_fmt: fn(f64) -> String,
    /// `data-chart` on the `<svg>`.
    pub id: String,
    pub title: String,
    body: String,
    bands: String,
    overlay: String,
    legend: Vec<LegendEntry>,
}

impl Chart {
    pub fn new(id: &str, title: &str, x: Scale, y: Scale, x_label: &str, y_label: &str) -> Chart {
        Chart {
            width: 1100.0,
            height: 320.0,
            left: 78.0,
            right: 290.0,
            top: 34.0,
            bottom: 46.0,
            x,
            y,
            x_label: x_label.into(),
            y_label: y_label.into(),
            x_ticks: None,
            y_categories: None,
            x_fmt: fmt_num,
            y_fmt: fmt_num,
            id: id.into(),
            title: title.into(),
            body: String::new(),
            bands: String::new(),
            overlay: String::new(),
            legend: Vec::new(),
        }
    }

    pub fn plot_w(&self) -> f64 {
        self.width - self.left - self.right
    }

    pub fn plot_h(&self) -> f64 {
        self.height - self.top - self.bottom
    }

    pub fn px(&self, x: f64) -> f64 {
        self.left + self.x.norm(x) * self.plot_w()
    }

    pub fn py(&self, y: f64) -> f64 {
        self.top + (1.0 - self.y.norm(y)) * self.plot_h()
    }

    /// Phase bands behind the series, labelled along the top edge.
    pub fn bands(&mut self, bands: &[Band]) {
        let (top, h) = (self.top, self.plot_h());
        let mut o = String::new();
        for b in bands {
            let x0 = self.px(b.start).clamp(self.left, self.left + self.plot_w());
            let x1 = self.px(b.end).clamp(self.left, self.left + self.plot_w());
            let w = (x1 - x0).max(1.0);
            let _ = write!(
                o,
                r#"<g class="phase" data-phase="{}"><title>{}</title><rect x="{x0:.1}" y="{top:.1}" width="{w:.1}" height="{h:.1}" fill="{}" fill-opacity="0.55"/>"#,
                esc(&b.name),
                esc(&b.title),
                b.fill
            );
            for (t, title) in &b.marks {
                let x = self.px(*t);
                let _ = write!(
                    o,
                    r##"<line class="phase-mark" x1="{x:.1}" x2="{x:.1}" y1="{top:.1}" y2="{:.1}" stroke="#9a9a9a" stroke-width="0.6"><title>{}</title></line>"##,
                    top + h,
                    esc(title)
                );
            }
            // A label only where it fits.
            if w >= 7.0 * b.name.len() as f64 {
                let _ = write!(
                    o,
                    r##"<text class="phase-label" x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11" fill="#555">{}</text>"##,
                    x0 + w / 2.0,
                    top - 5.0,
                    esc(&b.name)
                );
            }
            o.push_str("</g>");
        }
        self.bands.push_str(&o);
    }

    /// A line through `points` (x, y, hover text), optionally with ±error bars and point markers.
    pub fn line(
        &mut self,
        series: &str,
        colour: &str,
        dash: &str,
        points: &[(f64, f64, String)],
        errors: Option<&[f64]>,
        markers: bool,
    ) {
        let mut o = format!(r#"<g class="series" data-series="{}">"#, esc(series));
        let _ = write!(o, "<title>{}</title>", esc(series));
        let pts: Vec<(f64, f64)> =
            points.iter().filter(|p| p.1.is_finite()).map(|p| (self.px(p.0), self.py(p.1))).collect();
        if pts.len() > 1 {
            let d: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let dash_attr =
                if dash.is_empty() { String::new() } else { format!(r#" stroke-dasharray="{dash}""#) };
            let _ = write!(
                o,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.8"{dash_attr} points="{}"/>"#,
                d.join(" ")
            );
        }
        if let Some(err) = errors {
            for (p, e) in points.iter().zip(err) {
                if *e > 0.0 && p.1.is_finite() {
                    let x = self.px(p.0);
                    let (y0, y1) = (self.py(p.1 - e), self.py(p.1 + e));
                    let _ = write!(
                        o,
                        r#"<path class="errorbar" d="M{x:.1},{y0:.1}V{y1:.1}M{:.1},{y0:.1}h8M{:.1},{y1:.1}h8" stroke="{colour}" stroke-width="1" fill="none"/>"#,
                        x - 4.0,
                        x - 4.0
                    );
                }
            }
        }
        if markers || pts.len() == 1 {
            for p in points.iter().filter(|p| p.1.is_finite()) {
                let _ = write!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.2" fill="{colour}" data-x="{}" data-y="{}"><title>{}</title></circle>"#,
                    self.px(p.0),
                    self.py(p.1),
                    p.0,
                    p.1,
                    esc(&p.2)
                );
            }
        }
        o.push_str("</g>");
        self.body.push_str(&o);
        self.legend.push(LegendEntry {
            name: series.into(),
            colour: colour.into(),
            dash: dash.into(),
            marker: markers,
        });
    }

    /// Points only (events), each a marker with its own hover text and size.
    pub fn events(&mut self, series: &str, colour: &str, shape: Shape, points: &[(f64, f64, f64, String)]) {
        let mut o = format!(r#"<g class="series" data-series="{}">"#, esc(series));
        let _ = write!(o, "<title>{}</title>", esc(series));
        for (x, y, r, title) in points {
            let (cx, cy) = (self.px(*x), self.py(*y));
            let t = esc(title);
            let data = format!(r#" data-x="{x}""#);
            match shape {
                Shape::Circle => {
                    let _ = write!(
                        o,
                        r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="{r:.1}" fill="{colour}" fill-opacity="0.75"{data}><title>{t}</title></circle>"#
                    );
                }
                Shape::Diamond => {
                    let _ = write!(
                        o,
                        r#"<path d="M{cx:.1},{:.1}L{:.1},{cy:.1}L{cx:.1},{:.1}L{:.1},{cy:.1}Z" fill="{colour}" fill-opacity="0.85"{data}><title>{t}</title></path>"#,
                        cy - r,
                        cx + r,
                        cy + r,
                        cx - r
                    );
                }
            }
        }
        o.push_str("</g>");
        self.body.push_str(&o);
        self.legend.push(LegendEntry {
            name: series.into(),
            colour: colour.into(),
            dash: String::new(),
            marker: true,
        });
    }

    /// Raw SVG drawn above the bands and below the series.
    pub fn raw(&mut self, svg: &str) {
        self.body.insert_str(0, svg);
    }

    /// Raw SVG added to the series (clipped to the plot).
    pub fn push_body(&mut self, svg: &str) {
        self.body.push_str(svg);
    }

    /// Raw SVG drawn last, unclipped (a colour bar in the legend column).
    pub fn push_overlay(&mut self, svg: &str) {
        self.overlay.push_str(svg);
    }

    pub fn finish(self) -> String {
        let (w, h) = (self.width, self.height);
        let (l, t, pw, ph) = (self.left, self.top, self.plot_w(), self.plot_h());
        let mut o = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{}">"#,
            esc(&self.id),
            esc(&self.title)
        );
        let _ = write!(o, r##"<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>"##);
        o.push_str(&self.bands);
        // Grid and ticks.
        let mut axes = String::from(r##"<g class="axes" font-size="11" fill="#333">"##);
        let y_ticks: Vec<(f64, String)> = match &self.y_categories {
            Some(c) => c.iter().enumerate().map(|(i, s)| (i as f64, s.clone())).collect(),
            None => self.y.ticks(&|v| (self.y_fmt)(v)),
        };
        for (v, label) in y_ticks {
            let y = self.py(v);
            if !(t - 0.5..=t + ph + 0.5).contains(&y) {
                continue;
            }
            let _ = write!(
                axes,
                r##"<line x1="{l:.1}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#e3e3e3"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                l + pw,
                l - 6.0,
                y + 4.0,
                esc(&label)
            );
        }
        let x_ticks: Vec<(f64, String)> = match &self.x_ticks {
            Some(t) => t.clone(),
            None => self.x.ticks(&|v| (self.x_fmt)(v)),
        };
        for (v, label) in x_ticks {
            let x = self.px(v);
            if !(l - 0.5..=l + pw + 0.5).contains(&x) {
                continue;
            }
            let _ = write!(
                axes,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="#999"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                t + ph,
                t + ph + 5.0,
                t + ph + 18.0,
                esc(&label)
            );
        }
        let _ = write!(
            axes,
            r##"<rect x="{l:.1}" y="{t:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#888"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text><text x="{l:.1}" y="14" font-size="13" font-weight="bold">{}</text></g>"##,
            l + pw / 2.0,
            h - 8.0,
            esc(&self.x_label),
            t + ph / 2.0,
            esc(&self.y_label),
            esc(&self.title)
        );
        o.push_str(&axes);
        // Series, clipped to the plot area.
        let clip = format!("clip-{}", self.id.replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
        let _ = write!(
            o,
            r#"<clipPath id="{clip}"><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/></clipPath><g clip-path="url(#{clip})">{}</g>"#,
            l - 6.0,
            t - 6.0,
            pw + 12.0,
            ph + 12.0,
            self.body
        );
        // Legend on the right.
        let lx = l + pw + 16.0;
        let mut ly = t + 6.0;
        o.push_str(r##"<g class="legend" font-size="11" fill="#222">"##);
        for e in &self.legend {
            if ly > h - 10.0 {
                let _ = write!(o, r#"<text x="{lx:.1}" y="{ly:.1}">…</text>"#);
                break;
            }
            let dash_attr =
                if e.dash.is_empty() { String::new() } else { format!(r#" stroke-dasharray="{}""#, e.dash) };
            let _ = write!(
                o,
                r#"<line x1="{lx:.1}" x2="{:.1}" y1="{ly:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash_attr}/>"#,
                lx + 22.0,
                e.colour
            );
            if e.marker {
                let _ =
                    write!(o, r#"<circle cx="{:.1}" cy="{ly:.1}" r="3" fill="{}"/>"#, lx + 11.0, e.colour);
            }
            let name: String = if e.name.chars().count() > 44 {
                e.name.chars().take(43).chain(std::iter::once('…')).collect()
            } else {
                e.name.clone()
            };
            let _ = write!(
                o,
                r#"<text x="{:.1}" y="{:.1}">{}<title>{}</title></text>"#,
                lx + 28.0,
                ly + 4.0,
                esc(&name),
                esc(&e.name)
            );
            ly += 16.0;
        }
        o.push_str("</g>");
        o.push_str(&self.overlay);
        o.push_str("</svg>");
        o
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Shape {
    Circle,
    Diamond,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_keeps_markup_out() {
        assert_eq!(esc(r#"<a href="x">&'"#), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
        assert_eq!(esc("a\u{1}b"), "a b");
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(nice_ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(nice_ticks(0.0, 841062.0, 6), vec![0.0, 200000.0, 400000.0, 600000.0, 800000.0]);
        let t = Scale::log([3.0, 250.0]).ticks(&fmt_num);
        assert_eq!(t.iter().map(|x| x.1.as_str()).collect::<Vec<_>>(), ["1", "10", "100", "1000"]);
        let t = Scale::log([16.5, 81.0]).ticks(&fmt_num);
        assert_eq!(t.iter().map(|x| x.1.as_str()).collect::<Vec<_>>(), ["10", "20", "50", "100"]);
    }

    #[test]
    fn numbers_read_like_a_table() {
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(12.0), "12");
        assert_eq!(fmt_num(3.25), "3.25");
        assert_eq!(fmt_num(0.5), "0.5");
        assert_eq!(fmt_num(49979.0), "50k");
        assert_eq!(fmt_num(841062.0), "841k");
        assert_eq!(fmt_num(12_500_000.0), "12.5M");
    }

    #[test]
    fn log_colour_scale_separates_zero_and_orders_of_magnitude() {
        let s = LogColour { max: 15952.0 };
        assert_eq!(s.colour(0.0), ZERO_COLOUR);
        assert_eq!(s.position(15952.0), 1.0);
        // One block is far from nothing on a log scale, and 10 × more is a visible step.
        assert!(s.position(1.0) > 0.05);
        let (p10, p100) = (s.position(10.0), s.position(100.0));
        assert!(p100 - p10 > 0.2, "{p10} {p100}");
        assert_eq!(viridis(0.0), "#440154");
        assert_eq!(viridis(1.0), "#fde725");
    }

    #[test]
    fn a_chart_names_its_series_and_is_well_formed() {
        let mut c =
            Chart::new("t", "T & t", Scale::linear([0.0, 10.0], true), Scale::log([1.0, 1e4]), "x", "y");
        c.bands(&[Band {
            name: "fragment".into(),
            start: 1.0,
            end: 4.0,
            title: "fragment 3 s".into(),
            fill: "#eee",
            marks: vec![(2.0, "w 1".into())],
        }]);
        c.line(
            "Normal <order> 3",
            "#000",
            "",
            &[(0.0, 1.0, "a".into()), (5.0, 100.0, "b".into())],
            None,
            true,
        );
        let svg = c.finish();
        assert!(svg.contains(r#"data-series="Normal &lt;order&gt; 3""#), "{svg}");
        assert!(svg.contains(r#"data-phase="fragment""#));
        assert!(svg.contains("T &amp; t"));
        assert!(svg.matches("<g").count() == svg.matches("</g>").count());
    }
}
