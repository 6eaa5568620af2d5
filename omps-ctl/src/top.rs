//! `omps-ctl top`: a live view of the server, a row per client and a line per GPU, drawn
//! with ratatui from the server's metrics (the same figures Prometheus scrapes), sampled
//! every interval so that launches and server time read as rates.
//!
//! `omps-ctl top --once` prints one frame as text (two samples a second apart), for logs
//! and scripts.

use crate::talk;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Frame;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One metric sample: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Reads Prometheus's exposition text (what `omps-ctl metrics` prints).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (head, value) = l.rsplit_once(' ')?;
            let value = value.parse().ok()?;
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => (n, labels_of(rest.strip_suffix('}')?)?),
                None => (head, BTreeMap::new()),
            };
            Some(Sample {
                name: name.to_string(),
                labels,
                value,
            })
        })
        .collect()
}

/// `k="v",k2="v2"` (values may hold escaped quotes and commas).
fn labels_of(s: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (k, after) = rest.split_once("=\"")?;
        let mut v = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => v.push(chars.next()?.1),
                '"' => break i,
                c => v.push(c),
            }
        };
        out.insert(k.trim_start_matches(',').to_string(), v);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(out)
}

/// What one frame shows, from two samples `dt` apart.
pub struct View {
    pub gpus: Vec<String>,
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

fn get<'a>(s: &'a [Sample], name: &str, l: &[(&str, &str)]) -> impl Iterator<Item = &'a Sample> {
    let want: Vec<(String, String)> = l
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let name = name.to_string();
    s.iter()
        .filter(move |x| x.name == name && want.iter().all(|(k, v)| x.labels.get(k) == Some(v)))
}

fn one(s: &[Sample], name: &str, l: &[(&str, &str)]) -> Option<f64> {
    get(s, name, l).next().map(|x| x.value)
}

fn gib(b: f64) -> String {
    if b >= (1u64 << 30) as f64 {
        format!("{:.1}G", b / (1u64 << 30) as f64)
    } else {
        format!("{:.0}M", b / (1u64 << 20) as f64)
    }
}

pub fn view(before: &[Sample], now: &[Sample], dt: f64) -> View {
    let mut gpus = Vec::new();
    for g in get(now, "omps_gpu_memory_total_bytes", &[]) {
        let l = |k: &str| g.labels.get(k).cloned().unwrap_or_default();
        let ord = l("gpu");
        let q = [("gpu", ord.as_str())];
        let used = one(now, "omps_gpu_memory_used_bytes", &q).unwrap_or(0.0);
        let util = one(now, "omps_gpu_utilization_percent", &q)
            .map_or("n/a".to_string(), |u| format!("{u:.0}%"));
        let fault = one(now, "omps_gpu_fault", &q).unwrap_or(0.0) > 0.0;
        let clients = one(now, "omps_gpu_clients", &q).unwrap_or(0.0);
        gpus.push(format!(
            "GPU {ord} {}  {}  SM busy {util}  memory {} / {}  clients {clients}  {}",
            if fault { "FAULT" } else { "ACTIVE" },
            l("name"),
            gib(used),
            gib(g.value),
            l("uuid"),
        ));
    }
    let header = vec![
        "PID",
        "COMMAND",
        "GPU",
        "MEMORY",
        "LIMIT",
        "LAUNCH/S",
        "SRV MS/S",
        "QOS",
        "THREADS",
        "CONTAINER",
    ];
    let mut rows = Vec::new();
    for c in get(now, "omps_client_launches_total", &[]) {
        let l = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
        let id = l("client");
        let q = [("client", id.as_str())];
        let rate = |name: &str, scale: f64| {
            let a = one(before, name, &q);
            let b = one(now, name, &q).unwrap_or(0.0);
            a.map_or("-".to_string(), |a| {
                format!("{:.0}", (b - a).max(0.0) * scale / dt)
            })
        };
        let mems: Vec<&Sample> = get(now, "omps_client_memory_bytes", &q)
            .filter(|m| m.value > 0.0)
            .collect();
        let gpu_list: Vec<String> = mems.iter().map(|m| m.labels["gpu"].clone()).collect();
        let mem: f64 = mems.iter().map(|m| m.value).sum();
        let limits: Vec<String> = get(now, "omps_client_memory_limit_bytes", &q)
            .map(|m| format!("{}:{}", m.labels["gpu"], gib(m.value)))
            .collect();
        let container = l("container");
        rows.push(vec![
            l("pid"),
            l("command"),
            if gpu_list.is_empty() {
                "-".into()
            } else {
                gpu_list.join(",")
            },
            gib(mem),
            if limits.is_empty() {
                "-".into()
            } else {
                limits.join(",")
            },
            rate("omps_client_launches_total", 1.0),
            rate("omps_client_server_seconds_total", 1000.0),
            l("qos"),
            one(now, "omps_client_active_thread_percentage", &q)
                .map_or("-".into(), |p| format!("{p:.0}%")),
            if container.is_empty() {
                "-".into()
            } else {
                container.chars().take(12).collect()
            },
        ]);
    }
    View { gpus, header, rows }
}

fn draw(f: &mut Frame, v: &View) {
    let [top, table] = Layout::vertical([
        Constraint::Length(v.gpus.len() as u16 + 2),
        Constraint::Min(3),
    ])
    .areas(f.area());
    let lines: Vec<Line> = v.gpus.iter().map(|g| Line::raw(g.as_str())).collect();
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" omps top (q quits) ")),
        top,
    );
    let widths = [
        Constraint::Length(8),
        Constraint::Min(12),
        Constraint::Length(4),
        Constraint::Length(7),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(16),
        Constraint::Length(8),
        Constraint::Length(12),
    ];
    let rows = v.rows.iter().map(|r| Row::new(r.clone()));
    let t = Table::new(rows, widths)
        .header(Row::new(v.header.clone()).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::bordered().title(format!(" {} clients ", v.rows.len())));
    f.render_widget(t, table);
}

fn sample() -> Result<Vec<Sample>, String> {
    Ok(parse(&talk::ask("metrics")?))
}

/// One frame as text, `width` columns wide.
pub fn once(width: u16) -> Result<String, String> {
    let a = sample()?;
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let b = sample()?;
    let v = view(&a, &b, t.elapsed().as_secs_f64());
    Ok(render_text(&v, width))
}

pub fn render_text(v: &View, width: u16) -> String {
    let height = (v.gpus.len() + v.rows.len()) as u16 + 7;
    let mut term = ratatui::Terminal::new(ratatui::backend::TestBackend::new(width, height))
        .expect("a test backend always opens");
    term.draw(|f| draw(f, v)).expect("drawing to memory");
    let buf = term.backend().buffer();
    let mut out = String::new();
    for y in 0..height {
        let line: String = (0..width).map(|x| buf[(x, y)].symbol()).collect();
        out += line.trim_end();
        out.push('\n');
    }
    out
}

/// The live view, until `q` or Esc.
pub fn run(interval: Duration) -> Result<(), String> {
    use ratatui::crossterm::event::{self, Event, KeyCode};
    let mut before = sample()?;
    let mut t = Instant::now();
    let mut term = ratatui::init();
    let result = (|| loop {
        if event::poll(interval).map_err(|e| e.to_string())? {
            if let Event::Key(k) = event::read().map_err(|e| e.to_string())? {
                if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                    return Ok(());
                }
            }
        }
        let now = sample()?;
        let v = view(&before, &now, t.elapsed().as_secs_f64().max(1e-3));
        term.draw(|f| draw(f, &v)).map_err(|e| e.to_string())?;
        before = now;
        t = Instant::now();
    })();
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "# HELP x\nomps_gpu_memory_total_bytes{gpu=\"0\",uuid=\"GPU-1\",name=\"H100\"} 85899345920\n\
        omps_gpu_memory_used_bytes{gpu=\"0\",uuid=\"GPU-1\",name=\"H100\"} 10737418240\n\
        omps_gpu_fault{gpu=\"0\",uuid=\"GPU-1\",name=\"H100\"} 0\n\
        omps_gpu_clients{gpu=\"0\",uuid=\"GPU-1\",name=\"H100\"} 1\n\
        omps_client_launches_total{pid=\"42\",client=\"3\",command=\"python3\",qos=\"normal\",container=\"\",pod=\"\"} 1000\n\
        omps_client_server_seconds_total{pid=\"42\",client=\"3\",command=\"python3\",qos=\"normal\",container=\"\",pod=\"\"} 0.5\n\
        omps_client_memory_bytes{pid=\"42\",client=\"3\",command=\"python3\",qos=\"normal\",container=\"\",pod=\"\",gpu=\"0\",uuid=\"GPU-1\"} 2147483648\n\
        omps_client_memory_limit_bytes{pid=\"42\",client=\"3\",command=\"python3\",qos=\"normal\",container=\"\",pod=\"\",gpu=\"0\",uuid=\"GPU-1\"} 4294967296\n";

    #[test]
    fn exposition_text_is_read_with_escapes() {
        let s = parse("m{a=\"x\\\"y,z\",b=\"\"} 3.5\n# c\nn 1\n");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].labels["a"], "x\"y,z");
        assert_eq!(s[0].labels["b"], "");
        assert_eq!((s[0].value, s[1].name.as_str()), (3.5, "n"));
    }

    #[test]
    fn rates_come_from_two_samples() {
        let b = A.replace("} 1000", "} 3000").replace("} 0.5", "} 0.75");
        let v = view(&parse(A), &parse(&b), 2.0);
        assert_eq!(v.rows.len(), 1);
        let r = &v.rows[0];
        assert_eq!(
            (r[0].as_str(), r[1].as_str(), r[2].as_str()),
            ("42", "python3", "0")
        );
        assert_eq!((r[3].as_str(), r[4].as_str()), ("2.0G", "0:4.0G"));
        assert_eq!(
            (r[5].as_str(), r[6].as_str()),
            ("1000", "125"),
            "launches/s, server ms/s"
        );
        assert!(
            v.gpus[0].contains("memory 10.0G / 80.0G") && v.gpus[0].starts_with("GPU 0 ACTIVE"),
            "{}",
            v.gpus[0]
        );
        let text = render_text(&v, 120);
        assert!(
            text.contains("LAUNCH/S") && text.contains("python3"),
            "{text}"
        );
    }
}
