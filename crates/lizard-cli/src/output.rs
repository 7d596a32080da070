//! Human-readable output: aligned tables and `field  value` blocks. `--json` bypasses
//! these and prints what the server answered.

use serde_json::Value;

/// Pretty JSON on stdout.
pub fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Columns padded to their widest cell; the last column is not padded.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table { headers: headers.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate().take(n) {
                if i + 1 == n {
                    line.push_str(c);
                } else {
                    line.push_str(&format!("{c:<w$}  ", w = widths[i]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// `name  value` lines, names padded to the longest; empty values are left out.
pub fn render_fields(fields: &[(&str, String)]) -> String {
    let w = fields.iter().filter(|(_, v)| !v.is_empty()).map(|(k, _)| k.len()).max().unwrap_or(0);
    fields.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k:<w$}  {v}\n")).collect()
}

pub fn print_fields(fields: &[(&str, String)]) {
    print!("{}", render_fields(fields));
}

/// A JSON field as text: strings bare, numbers and booleans as written, null/absent empty,
/// anything else as compact JSON.
pub fn text(v: &Value, field: &str) -> String {
    match v.get(field) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// `a, b` or `none`.
pub fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align() {
        let mut t = Table::new(&["ID", "NAME"]);
        t.row(vec!["ws_1".into(), "a".into()]);
        t.row(vec!["ws_12345".into(), "b c".into()]);
        assert_eq!(t.render(), "ID        NAME\nws_1      a\nws_12345  b c\n");
        assert_eq!(
            render_fields(&[("id", "x".into()), ("email", "".into()), ("plan", "free".into())]),
            "id    x\nplan  free\n"
        );
        let v = serde_json::json!({"s": "x", "n": 3, "z": null});
        assert_eq!(
            (text(&v, "s"), text(&v, "n"), text(&v, "z"), text(&v, "q")),
            ("x".into(), "3".into(), "".into(), "".into())
        );
    }
}
