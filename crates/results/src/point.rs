//! A sweep point: the value of every sweep axis at one cell of the sweep matrix, in the order the
//! axes were swept (workload options first, then `sysctl.NAME` axes).
//!
//! Stored as a JSON object, `{"threads": 4, "sysctl.net.ipv4.tcp_rmem": "4096 131072 6291456"}`, so a
//! reader never splits a label: a value may hold spaces or `=`. The label (`threads=4
//! sysctl.net.ipv4.tcp_rmem=4096 131072 6291456`) is for people only.

use std::cmp::Ordering;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// `{axis: value}` in sweep order; empty without a sweep.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Point {
    pub axes: Vec<(String, Value)>,
}

impl Point {
    /// The point of a run without a sweep.
    pub fn none() -> Point {
        Point::default()
    }

    /// `threads=4 sysctl.net.core.high_order_alloc_disable=1`, or `-` without a sweep.
    pub fn label(&self) -> String {
        if self.axes.is_empty() {
            return "-".into();
        }
        self.axes.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect::<Vec<_>>().join(" ")
    }

    /// The value of `axis` at this point.
    pub fn get(&self, axis: &str) -> Option<&Value> {
        self.axes.iter().find(|(k, _)| k == axis).map(|(_, v)| v)
    }

    /// The point without `axis` (the other axes' values), for plotting one axis against the rest.
    pub fn without(&self, axis: &str) -> Point {
        Point { axes: self.axes.iter().filter(|(k, _)| k != axis).cloned().collect() }
    }

    /// A point from a label written by fraglab before the results schema (`threads=4
    /// sysctl.x=1`). Words are `AXIS=VALUE`; a word with no `=` belongs to the value before it, so
    /// a multi-word sysctl value comes back whole. A value that itself held `=` followed by a
    /// space cannot be told apart from a new axis: those labels were ambiguous when written.
    pub fn from_legacy_label(label: &str) -> Point {
        let mut axes: Vec<(String, Value)> = Vec::new();
        if label.trim() == "-" {
            return Point::none();
        }
        for word in label.split(' ') {
            match (word.split_once('='), axes.last_mut()) {
                (Some((k, v)), _) if !k.is_empty() => axes.push((k.to_string(), legacy_value(v))),
                (_, Some((_, Value::String(s)))) => {
                    s.push(' ');
                    s.push_str(word);
                }
                (_, Some((_, v))) => *v = Value::String(format!("{} {word}", plain(v))),
                (_, None) => axes.push((word.to_string(), Value::Null)),
            }
        }
        Point { axes }
    }

    /// Order points by value: `msg=4KiB` before `msg=16KiB`, `clients=2` before `clients=10`.
    /// Values that read as numbers or sizes compare by value, others as text; axes in sweep order.
    pub fn by_value(&self, other: &Point) -> Ordering {
        let value = |v: &Value| match v {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => {
                s.parse::<f64>().ok().or_else(|| fraglab_units::parse_size(s).ok().map(|b| b as f64))
            }
            _ => None,
        };
        for ((kx, vx), (ky, vy)) in self.axes.iter().zip(&other.axes) {
            let by_value = match (value(vx), value(vy)) {
                (Some(p), Some(q)) => p.total_cmp(&q),
                _ => plain(vx).cmp(&plain(vy)),
            };
            let o = kx.cmp(ky).then(by_value);
            if o.is_ne() {
                return o;
            }
        }
        self.axes.len().cmp(&other.axes.len())
    }
}

/// A legacy label's value as the sweep wrote it: numbers were written bare, everything else as text.
fn legacy_value(v: &str) -> Value {
    match serde_json::from_str::<Value>(v) {
        Ok(n @ Value::Number(_)) | Ok(n @ Value::Bool(_)) => n,
        _ => Value::String(v.to_string()),
    }
}

/// `4`, `"16MiB"` → `4`, `16MiB`: a sweep value as labels and sysctls write it.
pub fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

// Points are map keys in compare and report: equal when every axis and value is, ordered by their
// JSON text (serde_json's Value has no order of its own).
impl Eq for Point {}

impl Ord for Point {
    fn cmp(&self, other: &Self) -> Ordering {
        let key = |p: &Point| p.axes.iter().map(|(k, v)| (k.clone(), v.to_string())).collect::<Vec<_>>();
        key(self).cmp(&key(other))
    }
}

impl PartialOrd for Point {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Serialize for Point {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.axes.len()))?;
        for (k, v) in &self.axes {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

// A map that keeps the axes' order (serde_json's own Map would sort them without the
// preserve_order feature), and the label string schema 1 stored.
impl<'de> Deserialize<'de> for Point {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Point, D::Error> {
        struct PointVisitor;
        impl<'de> Visitor<'de> for PointVisitor {
            type Value = Point;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a sweep point: {axis: value}, or a schema-1 label")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Point, A::Error> {
                let mut axes = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    axes.push((k, v));
                }
                Ok(Point { axes })
            }
            fn visit_str<E: serde::de::Error>(self, label: &str) -> Result<Point, E> {
                Ok(Point::from_legacy_label(label))
            }
        }
        d.deserialize_any(PointVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn point(axes: &[(&str, Value)]) -> Point {
        Point { axes: axes.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() }
    }

    #[test]
    fn a_point_keeps_its_axes_in_sweep_order_through_json() {
        let p = point(&[("threads", json!(4)), ("sysctl.net.ipv4.tcp_rmem", json!("4096 131072 6291456"))]);
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, r#"{"threads":4,"sysctl.net.ipv4.tcp_rmem":"4096 131072 6291456"}"#);
        assert_eq!(serde_json::from_str::<Point>(&text).unwrap(), p);
        assert_eq!(p.label(), "threads=4 sysctl.net.ipv4.tcp_rmem=4096 131072 6291456");
    }

    #[test]
    fn legacy_labels_come_back_with_multi_word_values_whole() {
        let p = Point::from_legacy_label("sysctl.net.ipv4.tcp_rmem=4096 131072 6291456 threads=2");
        assert_eq!(
            p,
            point(&[("sysctl.net.ipv4.tcp_rmem", json!("4096 131072 6291456")), ("threads", json!(2))])
        );
        assert_eq!(Point::from_legacy_label("-"), Point::none());
        assert_eq!(
            serde_json::from_str::<Point>(r#""msg=16KiB""#).unwrap(),
            point(&[("msg", json!("16KiB"))])
        );
    }

    #[test]
    fn points_order_by_value_not_text() {
        let mut v: Vec<Point> = ["msg=32KiB", "msg=4KiB", "msg=16KiB", "msg=1MiB"]
            .into_iter()
            .map(Point::from_legacy_label)
            .collect();
        v.sort_by(Point::by_value);
        let labels: Vec<String> = v.iter().map(Point::label).collect();
        assert_eq!(labels, ["msg=4KiB", "msg=16KiB", "msg=32KiB", "msg=1MiB"]);
        let mut v: Vec<Point> = [
            "clients=10 sysctl.net.core.high_order_alloc_disable=1",
            "clients=2 sysctl.net.core.high_order_alloc_disable=1",
            "clients=10 sysctl.net.core.high_order_alloc_disable=0",
            "clients=2 sysctl.net.core.high_order_alloc_disable=0",
        ]
        .into_iter()
        .map(Point::from_legacy_label)
        .collect();
        v.sort_by(Point::by_value);
        let labels: Vec<String> = v.iter().map(Point::label).collect();
        assert_eq!(
            labels,
            [
                "clients=2 sysctl.net.core.high_order_alloc_disable=0",
                "clients=2 sysctl.net.core.high_order_alloc_disable=1",
                "clients=10 sysctl.net.core.high_order_alloc_disable=0",
                "clients=10 sysctl.net.core.high_order_alloc_disable=1",
            ]
        );
        let text = |s: &str| Point::from_legacy_label(s);
        assert_eq!(text("style=one-to-many").by_value(&text("style=one-to-one")), Ordering::Less);
    }
}
