//! The plot: latency against N, per contestant, log-log. Left: TCP
//! `connect()` through a VIP (p50 solid, p99 dashed) with the no-proxy
//! baseline; right: programming latency (one new Service p50 solid,
//! endpoint change under churn p99 dashed). Written as SVG and PNG.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::contestant::ContestantKind;
use super::results::BenchReport;

/// One line of a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Legend text.
    pub label: String,
    /// Palette index.
    pub color: usize,
    /// p99 lines are dashed.
    pub dashed: bool,
    /// (N, milliseconds), ascending N.
    pub points: Vec<(f64, f64)>,
}

fn color_of(kind: Option<ContestantKind>) -> usize {
    match kind {
        Some(ContestantKind::KeelsonNftables) => 0,
        Some(ContestantKind::KeelsonEbpf) => 1,
        Some(ContestantKind::KubeProxyNftables) => 2,
        Some(ContestantKind::KubeProxyIptables) => 3,
        None => 4,
        Some(ContestantKind::KeelsonProxyNftables) => 5,
        Some(ContestantKind::KeelsonProxyEbpf) => 6,
    }
}

fn palette(i: usize) -> RGBColor {
    [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(60, 60, 60),
        RGBColor(23, 190, 207),
        RGBColor(188, 189, 34),
    ][i % 7]
}

/// The lines of both panels.
pub fn lines(report: &BenchReport) -> (Vec<Line>, Vec<Line>) {
    let mut kinds: Vec<ContestantKind> = report.runs.iter().map(|r| r.contestant).collect();
    kinds.sort();
    kinds.dedup();
    let series = |kind: ContestantKind, f: &dyn Fn(&super::results::RunResult) -> Option<f64>| {
        report
            .runs
            .iter()
            .filter(|r| r.contestant == kind)
            .filter_map(|r| Some((r.services as f64, f(r)?)))
            .collect::<Vec<_>>()
    };
    let mut left = Vec::new();
    let mut right = Vec::new();
    for k in kinds {
        let c = color_of(Some(k));
        left.push(Line {
            label: format!("{k} p50"),
            color: c,
            dashed: false,
            points: series(k, &|r| r.connect.p50_ms),
        });
        left.push(Line {
            label: format!("{k} p99"),
            color: c,
            dashed: true,
            points: series(k, &|r| r.connect.p99_ms),
        });
        right.push(Line {
            label: format!("{k} new Service p50"),
            color: c,
            dashed: false,
            points: series(k, &|r| r.service_add.p50_ms),
        });
        right.push(Line {
            label: format!("{k} churn p99"),
            color: c,
            dashed: true,
            points: series(k, &|r| r.programming_churn.p99_ms),
        });
    }
    for (label, dashed, pick) in [
        ("no proxy p50", false, 0usize),
        ("no proxy p99", true, 1usize),
    ] {
        left.push(Line {
            label: label.into(),
            color: color_of(None),
            dashed,
            points: report
                .baselines
                .iter()
                .filter_map(|b| {
                    let v = if pick == 0 {
                        b.connect.p50_ms
                    } else {
                        b.connect.p99_ms
                    };
                    Some((b.services as f64, v?))
                })
                .collect(),
        });
    }
    left.retain(|l| !l.points.is_empty());
    right.retain(|l| !l.points.is_empty());
    (left, right)
}

/// A log axis range covering `values` (widened when they are one point).
pub fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (0.1, 10.0);
    }
    if lo == hi {
        // One point: a decade each side, so the axis has labelled ticks.
        return (lo / 10.0, hi * 10.0);
    }
    (lo / 2.0, hi * 2.0)
}

/// An axis label: at most three decimals, no trailing zeros.
pub fn short_number(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() {
        "0".into()
    } else {
        s.to_string()
    }
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    lines: &[Line],
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let (x0, x1) = log_range(lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)));
    let (y0, y1) = log_range(lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("Services (N)")
        .y_desc("milliseconds")
        .x_label_formatter(&|x| format!("{}", x.round() as u64))
        .y_label_formatter(&|y| short_number(*y))
        .draw()
        .map_err(e)?;
    for l in lines {
        let color = palette(l.color);
        let style = ShapeStyle::from(color).stroke_width(2);
        if l.dashed {
            chart
                .draw_series(DashedLineSeries::new(l.points.clone(), 6, 4, style))
                .map_err(e)?
                .label(l.label.clone())
                .legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (7, 0)], style)
                        + PathElement::new(vec![(12, 0), (19, 0)], style)
                });
        } else {
            chart
                .draw_series(LineSeries::new(l.points.clone(), style))
                .map_err(e)?
                .label(l.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        chart
            .draw_series(l.points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    report: &BenchReport,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (left, right) = lines(report);
    let (a, b) = root.split_horizontally(root.dim_in_pixel().0 / 2);
    panel(&a, "TCP connect() through a VIP", &left)?;
    panel(&b, "programming latency (API write → traffic)", &right)?;
    root.present().map_err(|e| e.to_string())
}

/// Writes `<stem>.svg` and `<stem>.png` into `dir`; returns the paths.
pub fn write(
    report: &BenchReport,
    dir: &Path,
    stem: &str,
) -> Result<Vec<std::path::PathBuf>, String> {
    let size = (1400, 560);
    let svg = dir.join(format!("{stem}.svg"));
    draw(SVGBackend::new(&svg, size).into_drawing_area(), report)?;
    let png = dir.join(format!("{stem}.png"));
    draw(BitMapBackend::new(&png, size).into_drawing_area(), report)?;
    Ok(vec![svg, png])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::config::BenchConfig;
    use crate::bench::results::{Baseline, Machine, RunResult};
    use crate::bench::stats::Summary;

    fn summary(p50: f64, p99: f64) -> Summary {
        Summary {
            n: 2,
            p50_ms: Some(p50),
            p99_ms: Some(p99),
            ..Summary::default()
        }
    }

    fn report() -> BenchReport {
        let mut runs = Vec::new();
        for n in [100, 1000] {
            let mut r = RunResult::new(ContestantKind::KeelsonNftables, n, 2);
            r.connect = summary(0.05, 0.2);
            r.service_add = summary(3.0, 5.0);
            runs.push(r);
        }
        BenchReport {
            command: String::new(),
            started: String::new(),
            machine: Machine::default(),
            api_server: String::new(),
            config: BenchConfig::quick("/bin/true".into()),
            baselines: vec![Baseline {
                services: 100,
                connect: summary(0.04, 0.1),
            }],
            runs,
        }
    }

    #[test]
    fn lines_per_contestant_and_baseline() {
        let (left, right) = lines(&report());
        let labels: Vec<&str> = left.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "keelson nftables p50",
                "keelson nftables p99",
                "no proxy p50",
                "no proxy p99"
            ]
        );
        assert_eq!(left[0].points, vec![(100.0, 0.05), (1000.0, 0.05)]);
        // No churn probes: only the new-Service line remains.
        assert_eq!(right.len(), 1);
        assert_eq!(log_range([5.0].into_iter()), (0.5, 50.0));
        assert_eq!(log_range([5.0, 50.0].into_iter()), (2.5, 100.0));
        assert_eq!(log_range(std::iter::empty()), (0.1, 10.0));
    }

    #[test]
    fn axis_labels() {
        assert_eq!(short_number(0.4000000000004), "0.4");
        assert_eq!(short_number(20.0), "20");
        assert_eq!(short_number(0.0125), "0.013");
        assert_eq!(short_number(0.0), "0");
    }

    #[test]
    fn writes_svg_and_png() {
        let dir = tempfile::tempdir().expect("dir");
        let files = write(&report(), dir.path(), "latency").expect("plot");
        for f in files {
            let len = std::fs::metadata(&f).expect("written").len();
            assert!(len > 1000, "{} is {len} bytes", f.display());
        }
    }
}
