//! Accuracy of a quantized model against its float original: SQNR, max abs error and top-1
//! agreement per decoder layer and at the logits.
//!
//! Layer outputs are captured with a [`RecordingHook`] on the QDQ points that sit on them
//! ([`layer_output_points`](compiler::quant::points::layer_output_points)): QDQ is metadata on a
//! value, so the tensor a point receives *is* the previous layer's output, before quantization.
//! Running the float model with a recording hook and no inner hook (QDQ = identity) and the
//! fake-quant model with the same recording around a [`FakeQuantHook`](super::FakeQuantHook)
//! captures the same values in both.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use mllm_dsl::QdqAttr;

use crate::executor::{QdqHook, QdqHookError};

/// Records the input of selected QDQ points, then delegates to `inner` (identity when `None`).
pub struct RecordingHook {
    inner: Option<Arc<dyn QdqHook>>,
    keys: HashSet<String>,
    records: Mutex<BTreeMap<String, Vec<Vec<f32>>>>,
}

impl RecordingHook {
    pub fn new(inner: Option<Arc<dyn QdqHook>>, keys: impl IntoIterator<Item = String>) -> Self {
        RecordingHook { inner, keys: keys.into_iter().collect(), records: Mutex::new(BTreeMap::new()) }
    }

    /// Everything recorded at `key`, in call order, and clears it.
    pub fn take(&self, key: &str) -> Vec<Vec<f32>> {
        self.records.lock().map(|mut r| r.remove(key).unwrap_or_default()).unwrap_or_default()
    }
}

impl QdqHook for RecordingHook {
    fn apply(&self, point: &QdqAttr, x: &[f32], shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
        if self.keys.contains(&point.key) {
            let mut records = self.records.lock().map_err(|_| QdqHookError::Poisoned { what: "recording state" })?;
            records.entry(point.key.clone()).or_default().push(x.to_vec());
        }
        match &self.inner {
            Some(h) => h.apply(point, x, shape),
            None => Ok(None),
        }
    }
}

/// How close `test` is to `reference`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Comparison {
    pub name: String,
    /// `10 log10(sum ref^2 / sum (test - ref)^2)`; `+inf` when identical, NaN when either tensor
    /// holds a NaN or an infinity (see [`Comparison::sqnr`]).
    pub sqnr_db: f64,
    pub max_abs_error: f32,
    /// Fraction of rows (positions) whose argmax agrees.
    pub top1_agreement: f64,
    pub rows: usize,
}

impl Comparison {
    /// Compares two equally long tensors whose rows are `row_len` long (argmax per row).
    pub fn new(
        name: impl Into<String>,
        reference: &[f32],
        test: &[f32],
        row_len: usize,
    ) -> Result<Self, ComparisonError> {
        let name = name.into();
        if reference.len() != test.len() || row_len == 0 || !reference.len().is_multiple_of(row_len) {
            return Err(ComparisonError { name, reference: reference.len(), test: test.len(), row_len });
        }
        let (mut signal, mut noise, mut max_abs) = (0f64, 0f64, 0f32);
        for (&r, &t) in reference.iter().zip(test) {
            signal += f64::from(r) * f64::from(r);
            let d = f64::from(t) - f64::from(r);
            noise += d * d;
            max_abs = max_abs.max((t - r).abs());
        }
        let sqnr_db = if !(signal.is_finite() && noise.is_finite()) {
            f64::NAN
        } else if noise == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (signal / noise).log10()
        };
        let rows = reference.len() / row_len;
        let agree = reference
            .chunks_exact(row_len)
            .zip(test.chunks_exact(row_len))
            .filter(|(r, t)| argmax(r) == argmax(t))
            .count();
        Ok(Comparison { name, sqnr_db, max_abs_error: max_abs, top1_agreement: agree as f64 / rows as f64, rows })
    }

    /// The SQNR as what it means: a figure, identical tensors, or a non-finite comparison.
    pub fn sqnr(&self) -> Sqnr {
        Sqnr::of(self.sqnr_db)
    }
}

/// What an SQNR figure says. "Identical" (no noise at all) and "non-finite" (a NaN or infinity in
/// either tensor, or a figure that is not a number) are distinct values: the first passes any dB
/// floor, the second fails every one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sqnr {
    /// A finite figure in dB.
    Db(f64),
    /// The test equals the reference exactly (infinite SQNR).
    Identical,
    /// Not a figure: a NaN or infinity was in the data (or the figure is NaN or -inf).
    NonFinite,
}

impl Sqnr {
    /// `report.json`'s and the ledger's word for [`Sqnr::Identical`].
    pub const IDENTICAL: &'static str = "identical";
    /// `report.json`'s and the ledger's word for [`Sqnr::NonFinite`].
    pub const NON_FINITE: &'static str = "non-finite";

    /// Classifies a figure in dB: `+inf` is identical, NaN and `-inf` are non-finite.
    pub fn of(db: f64) -> Sqnr {
        if db.is_finite() {
            Sqnr::Db(db)
        } else if db == f64::INFINITY {
            Sqnr::Identical
        } else {
            Sqnr::NonFinite
        }
    }

    /// Reads the JSON form [`Sqnr::to_json`] writes; `None` for anything else.
    pub fn from_json(v: &serde_json::Value) -> Option<Sqnr> {
        match v {
            serde_json::Value::Number(n) => n.as_f64().filter(|x| x.is_finite()).map(Sqnr::Db),
            serde_json::Value::String(s) if s == Self::IDENTICAL => Some(Sqnr::Identical),
            serde_json::Value::String(s) if s == Self::NON_FINITE => Some(Sqnr::NonFinite),
            _ => None,
        }
    }

    /// The JSON form: the number of dB, `"identical"` or `"non-finite"`.
    pub fn to_json(self) -> serde_json::Value {
        match self {
            Sqnr::Db(db) => serde_json::json!(db),
            Sqnr::Identical => serde_json::json!(Self::IDENTICAL),
            Sqnr::NonFinite => serde_json::json!(Self::NON_FINITE),
        }
    }

    /// Whether the figure reaches `floor_db`: identical always does, non-finite never.
    pub fn at_least(self, floor_db: f64) -> bool {
        match self {
            Sqnr::Db(db) => db >= floor_db,
            Sqnr::Identical => true,
            Sqnr::NonFinite => false,
        }
    }
}

/// Two decimals of dB, or the word (padding and width apply, for tables).
impl std::fmt::Display for Sqnr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sqnr::Db(db) => f.pad(&format!("{db:.2}")),
            Sqnr::Identical => f.pad(Self::IDENTICAL),
            Sqnr::NonFinite => f.pad(Self::NON_FINITE),
        }
    }
}

/// Two tensors that cannot be compared row by row: their lengths differ or are not whole rows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{name}`: cannot compare {reference} reference values with {test} test values in rows of {row_len}")]
pub struct ComparisonError {
    pub name: String,
    pub reference: usize,
    pub test: usize,
    pub row_len: usize,
}

/// Index of the first largest value (NaN never wins).
pub fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

/// Per-layer and logits comparisons with what was evaluated.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AccuracyReport {
    /// What the rows compare (e.g. "fake-quant of out/ vs float of model/").
    pub description: String,
    pub sequences: usize,
    pub tokens: usize,
    pub rows: Vec<Comparison>,
}

impl AccuracyReport {
    /// The report as an aligned text table.
    pub fn table(&self) -> String {
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(5);
        let mut s = format!("{}\n{} sequences, {} tokens\n", self.description, self.sequences, self.tokens);
        let _ = writeln!(s, "{:<width$}  {:>9}  {:>12}  {:>6}", "tensor", "SQNR dB", "max |err|", "top-1");
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{:<width$}  {:>9}  {:>12.4e}  {:>5.1}%",
                r.name,
                r.sqnr(),
                r.max_abs_error,
                r.top1_agreement * 100.0
            );
        }
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        // A non-finite f64 is not JSON: each SQNR is written as [`Sqnr::to_json`] says.
        let mut v = serde_json::to_value(self).expect("report serializes");
        if let Some(rows) = v.get_mut("rows").and_then(|r| r.as_array_mut()) {
            for (row, r) in rows.iter_mut().zip(&self.rows) {
                row["sqnr_db"] = r.sqnr().to_json();
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison_by_hand() {
        // ref energy 1+4+9+16 = 30, noise 0.01 + 0 + 0.04 + 0 -> 10 log10(600).
        let r = [1.0, 2.0, 3.0, 4.0];
        let t = [1.1, 2.0, 2.8, 4.0];
        let c = Comparison::new("x", &r, &t, 2).unwrap();
        assert!((c.sqnr_db - 10.0 * (30.0f64 / 0.05).log10()).abs() < 1e-4, "{}", c.sqnr_db);
        assert!((c.max_abs_error - 0.2).abs() < 1e-6);
        assert_eq!((c.rows, c.top1_agreement), (2, 1.0));
        let flipped = Comparison::new("y", &r, &[2.0, 1.0, 3.0, 4.0], 2).unwrap();
        assert_eq!(flipped.top1_agreement, 0.5);
        assert_eq!(Comparison::new("z", &r, &r, 4).unwrap().sqnr_db, f64::INFINITY);
        assert!(Comparison::new("bad", &r, &t[..3], 1).is_err());
        let report = AccuracyReport { description: "d".into(), sequences: 1, tokens: 2, rows: vec![c] };
        assert!(report.table().contains("x"));
        assert!(report.to_json()["rows"][0]["sqnr_db"].as_f64().unwrap() > 27.0);
    }

    #[test]
    fn identical_and_non_finite_are_distinct_values() {
        let r = [1.0, 2.0, 3.0, 4.0];
        let same = Comparison::new("same", &r, &r, 4).unwrap();
        assert_eq!(same.sqnr(), Sqnr::Identical);
        let mut nan = r;
        nan[2] = f32::NAN;
        let mut inf = r;
        inf[1] = f32::INFINITY;
        // A NaN or infinity on either side, even where both sides hold the same one.
        for (name, reference, test) in [("nan", r, nan), ("inf", r, inf), ("ref-nan", nan, r), ("both-inf", inf, inf)] {
            let c = Comparison::new(name, &reference, &test, 4).unwrap();
            assert_eq!(c.sqnr(), Sqnr::NonFinite, "{name}: {}", c.sqnr_db);
            assert!(!c.sqnr().at_least(f64::MIN), "{name} passed a floor");
        }
        assert!(Sqnr::Identical.at_least(1e9) && Sqnr::Db(35.0).at_least(35.0) && !Sqnr::Db(34.9).at_least(35.0));
        assert_eq!(Sqnr::of(f64::NEG_INFINITY), Sqnr::NonFinite);
        let rows = vec![same, Comparison::new("nan", &r, &nan, 4).unwrap()];
        let report = AccuracyReport { description: "d".into(), sequences: 1, tokens: 1, rows };
        let json = report.to_json();
        assert_eq!(json["rows"][0]["sqnr_db"], "identical");
        assert_eq!(json["rows"][1]["sqnr_db"], "non-finite");
        for (row, want) in json["rows"].as_array().unwrap().iter().zip([Sqnr::Identical, Sqnr::NonFinite]) {
            assert_eq!(Sqnr::from_json(&row["sqnr_db"]), Some(want));
        }
        assert_eq!(Sqnr::from_json(&serde_json::Value::Null), None, "null is neither");
        let table = report.table();
        assert!(table.contains("identical") && table.contains("non-finite"), "{table}");
    }

    #[test]
    fn recording_hook_records_inputs_and_delegates() {
        struct Double;
        impl QdqHook for Double {
            fn apply(&self, _: &QdqAttr, x: &[f32], _: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
                Ok(Some(x.iter().map(|v| v * 2.0).collect()))
            }
        }
        let a = QdqAttr { kind: mllm_dsl::QdqKind::Activation, key: "a".into() };
        let b = QdqAttr { kind: mllm_dsl::QdqKind::Activation, key: "b".into() };
        let hook = RecordingHook::new(Some(Arc::new(Double)), ["a".to_string()]);
        assert_eq!(hook.apply(&a, &[1.0], &[1]).unwrap(), Some(vec![2.0]));
        assert_eq!(hook.apply(&b, &[3.0], &[1]).unwrap(), Some(vec![6.0]));
        assert_eq!(hook.take("a"), vec![vec![1.0]]);
        assert!(hook.take("b").is_empty());
        let plain = RecordingHook::new(None, ["b".to_string()]);
        assert_eq!(plain.apply(&b, &[3.0], &[1]).unwrap(), None);
    }
}
