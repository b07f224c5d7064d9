//! The chain: per stage, times and sizes; read from JSON or built in code.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One stage (a layer or a block of layers).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    #[serde(default)]
    pub name: String,
    /// Time of the forward pass (any unit; the schedule's time is in the same unit).
    pub forward_time: f64,
    /// Time of the backward pass.
    pub backward_time: f64,
    /// Bytes of the stage's output activation (its gradient has the same size).
    pub output_bytes: u64,
    /// Bytes the backward needs, saved by a forward that keeps everything;
    /// includes the output.
    pub saved_bytes: u64,
    /// Extra bytes used while the forward runs.
    #[serde(default)]
    pub forward_tmp_bytes: u64,
    /// Extra bytes used while the backward runs.
    #[serde(default)]
    pub backward_tmp_bytes: u64,
}

/// The loss at the end of the chain.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Loss {
    #[serde(default)]
    pub forward_time: f64,
    #[serde(default)]
    pub backward_time: f64,
    #[serde(default)]
    pub saved_bytes: u64,
    #[serde(default)]
    pub forward_tmp_bytes: u64,
    #[serde(default)]
    pub backward_tmp_bytes: u64,
}

/// A chain of stages and a loss. JSON:
/// `{"input_bytes": N, "stages": [{"forward_time":…,"backward_time":…,"output_bytes":…,"saved_bytes":…}, …], "loss": {…}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chain {
    /// Bytes of the network's input a₀.
    pub input_bytes: u64,
    pub stages: Vec<Stage>,
    #[serde(default)]
    pub loss: Loss,
}

/// A chain that cannot be planned.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ChainError {
    #[error("the chain has no stages")]
    Empty,
    #[error("stage {index} ({name}): {problem}")]
    BadStage { index: usize, name: String, problem: String },
    #[error("the loss: {0}")]
    BadLoss(String),
    #[error("not a valid chain: {0}")]
    Json(String),
    #[error("{0}")]
    TooLarge(String),
}

impl Chain {
    /// Reads and checks a chain from JSON: an object, its stages and loss
    /// objects too (not the positional arrays serde would also take), no key twice.
    pub fn from_json(text: &str) -> Result<Chain, ChainError> {
        let v = crate::json::parse(text).map_err(|e| ChainError::Json(e.to_string()))?;
        let object = |v: &Value, what: &str| match v {
            Value::Object(_) => Ok(()),
            other => Err(ChainError::Json(format!("{what} must be a JSON object, not {}", crate::json::kind(other)))),
        };
        object(&v, "the chain")?;
        if let Some(Value::Array(stages)) = v.get("stages") {
            for (i, stage) in stages.iter().enumerate() {
                object(stage, &format!("stage {i}"))?;
            }
        }
        if let Some(loss) = v.get("loss") {
            object(loss, "the loss")?;
        }
        let c: Chain = serde_json::from_value(v).map_err(|e| ChainError::Json(e.to_string()))?;
        c.check()?;
        Ok(c)
    }

    /// A homogeneous chain: `len` identical stages and a free loss.
    pub fn homogeneous(len: usize, fwd: f64, bwd: f64, x: u64, xbar: u64) -> Chain {
        Chain {
            input_bytes: x,
            stages: (0..len)
                .map(|i| Stage {
                    name: format!("layer{i}"),
                    forward_time: fwd,
                    backward_time: bwd,
                    output_bytes: x,
                    saved_bytes: xbar,
                    forward_tmp_bytes: 0,
                    backward_tmp_bytes: 0,
                })
                .collect(),
            loss: Loss::default(),
        }
    }

    /// Checks times are finite and non-negative and every stage saves at least its output.
    pub fn check(&self) -> Result<(), ChainError> {
        if self.stages.is_empty() {
            return Err(ChainError::Empty);
        }
        for (index, s) in self.stages.iter().enumerate() {
            let bad = |problem: String| ChainError::BadStage { index, name: s.name.clone(), problem };
            for (what, t) in [("forward_time", s.forward_time), ("backward_time", s.backward_time)] {
                if !t.is_finite() || t < 0.0 {
                    return Err(bad(format!("{what} must be a finite non-negative number, got {t}")));
                }
            }
            if s.saved_bytes < s.output_bytes {
                return Err(bad(format!(
                    "saved_bytes ({}) must include the output ({} bytes)",
                    s.saved_bytes, s.output_bytes
                )));
            }
        }
        for t in [self.loss.forward_time, self.loss.backward_time] {
            if !t.is_finite() || t < 0.0 {
                return Err(ChainError::BadLoss(format!("times must be finite and non-negative, got {t}")));
            }
        }
        // A schedule runs each forward at most once per stage after it; its time must stay a number.
        let a = self.arrays();
        let total: f64 = a.fw.iter().chain(&a.bw).sum();
        if !(total * (a.fw.len() as f64 + 1.0)).is_finite() {
            return Err(ChainError::TooLarge(format!(
                "the stages' times add up to {total:e}, too large to add up a schedule's time; use a larger time unit"
            )));
        }
        // Everything a schedule can hold at once is within the input, each stage's output twice
        // (itself and its gradient), its saved data and its transients: keep that sum in 64 bits.
        let sizes =
            a.x.iter().map(|&v| v as u128 * 2).chain(a.xbar.iter().chain(&a.ftmp).chain(&a.btmp).map(|&v| v as u128));
        if sizes.sum::<u128>() > u64::MAX as u128 {
            return Err(ChainError::TooLarge("the stages' sizes add up to more than 2^64 bytes".into()));
        }
        Ok(())
    }

    /// Stages, the loss included: L + 1.
    pub fn len_with_loss(&self) -> usize {
        self.stages.len() + 1
    }

    /// The per-stage arrays the solver and the simulator share, in bytes
    /// (indices as in the module documentation; the loss is stage L).
    pub(crate) fn arrays(&self) -> Arrays {
        let l = self.stages.len();
        let mut a = Arrays {
            fw: Vec::with_capacity(l + 1),
            bw: Vec::with_capacity(l + 1),
            x: Vec::with_capacity(l + 2),
            xbar: vec![0; l + 2],
            ftmp: Vec::with_capacity(l + 1),
            btmp: Vec::with_capacity(l + 1),
        };
        a.x.push(self.input_bytes);
        for (i, s) in self.stages.iter().enumerate() {
            a.fw.push(s.forward_time);
            a.bw.push(s.backward_time);
            a.x.push(s.output_bytes);
            a.xbar[i + 1] = s.saved_bytes;
            a.ftmp.push(s.forward_tmp_bytes);
            a.btmp.push(s.backward_tmp_bytes);
        }
        a.fw.push(self.loss.forward_time);
        a.bw.push(self.loss.backward_time);
        a.x.push(0);
        a.xbar[l + 1] = self.loss.saved_bytes;
        a.ftmp.push(self.loss.forward_tmp_bytes);
        a.btmp.push(self.loss.backward_tmp_bytes);
        a
    }
}

/// Times and sizes by stage index; the loss is stage L; `x[L+1] = 0`.
#[derive(Clone, Debug)]
pub(crate) struct Arrays {
    pub fw: Vec<f64>,
    pub bw: Vec<f64>,
    pub x: Vec<u64>,
    pub xbar: Vec<u64>,
    pub ftmp: Vec<u64>,
    pub btmp: Vec<u64>,
}

impl Arrays {
    /// The same with every time multiplied by `k`.
    pub fn with_times_scaled(mut self, k: f64) -> Arrays {
        for t in self.fw.iter_mut().chain(self.bw.iter_mut()) {
            *t *= k;
        }
        self
    }

    /// Sizes in slots of `unit` bytes, rounded up.
    pub fn in_slots(&self, unit: u64) -> Arrays {
        let d = |v: &Vec<u64>| v.iter().map(|&b| b.div_ceil(unit.max(1))).collect();
        Arrays {
            fw: self.fw.clone(),
            bw: self.bw.clone(),
            x: d(&self.x),
            xbar: d(&self.xbar),
            ftmp: d(&self.ftmp),
            btmp: d(&self.btmp),
        }
    }
}
