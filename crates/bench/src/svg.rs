//! A small hand-written SVG line chart: spawn latency and server RSS against
//! the number of concurrent processes (log scale), one line per server.

use crate::scenarios::Point;

const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

fn panel(
    out: &mut String,
    x0: f64,
    title: &str,
    series: &[(String, Vec<Point>)],
    value: impl Fn(&Point) -> f64,
) {
    let (w, h, top, left) = (420.0, 260.0, 40.0, x0 + 55.0);
    let max_v = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(&value))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let x_of = |n: usize| left + ((n as f64).log10() / 3.0) * w;
    let y_of = |v: f64| top + h - v / max_v * h;
    out.push_str(&format!(
        r#"<text x="{}" y="25" font-size="14" font-family="sans-serif">{title}</text>"#,
        left
    ));
    out.push_str(&format!(
        r##"<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>"##
    ));
    for n in [1usize, 10, 100, 1000] {
        let x = x_of(n);
        out.push_str(&format!(r#"<text x="{x}" y="{}" font-size="11" text-anchor="middle" font-family="sans-serif">{n}</text>"#, top + h + 15.0));
    }
    for k in 0..=4 {
        let v = max_v * k as f64 / 4.0;
        out.push_str(&format!(r#"<text x="{}" y="{}" font-size="11" text-anchor="end" font-family="sans-serif">{v:.1}</text>"#, left - 5.0, y_of(v) + 4.0));
    }
    out.push_str(&format!(r#"<text x="{}" y="{}" font-size="11" text-anchor="middle" font-family="sans-serif">concurrent processes</text>"#, left + w / 2.0, top + h + 32.0));
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", x_of(p.procs), y_of(value(p))))
            .collect();
        out.push_str(&format!(
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        ));
        for p in pts {
            out.push_str(&format!(
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                x_of(p.procs),
                y_of(value(p))
            ));
        }
        out.push_str(&format!(r#"<text x="{}" y="{}" font-size="12" fill="{c}" font-family="sans-serif">{name}</text>"#, left + 10.0, top + 16.0 + 16.0 * i as f64));
    }
}

pub fn render(series: &[(String, Vec<Point>)]) -> String {
    let mut out = String::from(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="1000" height="340" viewBox="0 0 1000 340"><rect width="1000" height="340" fill="white"/>"#,
    );
    panel(
        &mut out,
        0.0,
        "spawn p50 (ms) with N processes alive",
        series,
        |p| p.spawn_ms,
    );
    panel(
        &mut out,
        500.0,
        "server RSS (MiB) with N processes alive",
        series,
        |p| p.rss_mib,
    );
    out.push_str("</svg>\n");
    out
}
