//! MPS v3's list output: `--format=table` (the default: an upper-case header of the
//! field names, dashes as spaces, columns two spaces apart) or `--format=csv` (fields
//! joined by commas, `-` for an empty one), either without its header (`,noheader`).
//! Unlike MPS's table, omps never cuts a long value short (MPS prints `316...` for a
//! seven-digit PID, so its scripts must use CSV; omps's may use either).

/// How a list prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    pub csv: bool,
    pub header: bool,
}

impl Default for Format {
    fn default() -> Format {
        Format {
            csv: false,
            header: true,
        }
    }
}

pub fn render(fields: &[&str], rows: &[Vec<String>], f: Format) -> String {
    let cell = |c: &String| {
        if c.is_empty() {
            "-".to_string()
        } else {
            c.clone()
        }
    };
    let head: Vec<String> = fields
        .iter()
        .map(|h| h.replace('-', " ").to_uppercase())
        .collect();
    let mut out = String::new();
    if f.csv {
        if f.header {
            out += &fields.join(",");
            out.push('\n');
        }
        for r in rows {
            // A comma inside a value (a command line) would shift the columns.
            let cells: Vec<String> = r.iter().map(|c| cell(c).replace(',', ";")).collect();
            out += &cells.join(",");
            out.push('\n');
        }
        return out;
    }
    let mut widths: Vec<usize> = head
        .iter()
        .map(|h| if f.header { h.len() } else { 0 })
        .collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell(c).len());
        }
    }
    let line = |cells: Vec<String>| {
        let n = cells.len();
        let mut l = String::new();
        for (i, (c, w)) in cells.into_iter().zip(&widths).enumerate() {
            if i + 1 == n {
                l += &c;
            } else {
                l += &format!("{c:<width$}", width = w + 2);
            }
        }
        l.truncate(l.trim_end().len());
        l + "\n"
    };
    if f.header {
        out += &line(head);
    }
    for r in rows {
        out += &line(r.iter().map(cell).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_csv() {
        let rows = vec![
            vec!["training".to_string(), "1000".into(), String::new()],
            vec!["a".to_string(), "2".into(), "x,y".into()],
        ];
        let t = render(&["name", "uid", "pipe-directory"], &rows, Format::default());
        assert_eq!(
            t,
            "NAME      UID   PIPE DIRECTORY\ntraining  1000  -\na         2     x,y\n"
        );
        let c = render(
            &["name", "uid", "pipe-directory"],
            &rows,
            Format {
                csv: true,
                header: false,
            },
        );
        assert_eq!(c, "training,1000,-\na,2,x;y\n");
        let c = render(
            &["name"],
            &[],
            Format {
                csv: true,
                header: true,
            },
        );
        assert_eq!(c, "name\n");
    }
}
