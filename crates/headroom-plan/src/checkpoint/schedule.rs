//! Schedules and the validator: executes a schedule op by op under the
//! memory model of the module documentation, checks that every operation
//! has what it needs, and measures the time and the peak it takes.

use super::chain::{Arrays, Chain};
use std::fmt;

/// One operation of a schedule; the number is the stage (the loss is stage L).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Op {
    /// Forward that keeps its input and its output, and saves nothing for the backward.
    Fck(usize),
    /// Forward that drops its input and saves nothing.
    Fn(usize),
    /// Forward that saves everything its backward needs.
    Fall(usize),
    /// Backward.
    B(usize),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Fck(i) => write!(f, "Fck{i}"),
            Op::Fn(i) => write!(f, "Fn{i}"),
            Op::Fall(i) => write!(f, "Fall{i}"),
            Op::B(i) => write!(f, "B{i}"),
        }
    }
}

/// A schedule as the decisions that produce it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tree {
    /// `Fall(a)`, `B(a)`.
    Base(usize),
    /// `Fall(a)`, the rest, `B(a)`.
    Chain(usize, Box<Tree>),
    /// `Fck(a)`, `Fn(a+1..j−1)`, the right part from j, then the left part from a.
    Leaf { a: usize, j: usize, right: Box<Tree>, left: Box<Tree> },
}

impl Tree {
    /// The operations, in order.
    pub fn ops(&self) -> Vec<Op> {
        let mut out = Vec::new();
        self.push_ops(&mut out);
        out
    }

    fn push_ops(&self, out: &mut Vec<Op>) {
        match self {
            Tree::Base(a) => out.extend([Op::Fall(*a), Op::B(*a)]),
            Tree::Chain(a, rest) => {
                out.push(Op::Fall(*a));
                rest.push_ops(out);
                out.push(Op::B(*a));
            }
            Tree::Leaf { a, j, right, left } => {
                out.push(Op::Fck(*a));
                out.extend((a + 1..*j).map(Op::Fn));
                right.push_ops(out);
                left.push_ops(out);
            }
        }
    }
}

/// What a valid schedule takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// Sum of the times of its operations.
    pub time: f64,
    /// Most memory in use at any moment, transients included.
    pub peak: u64,
    /// Forward operations beyond one per stage.
    pub recomputations: usize,
}

/// Why a schedule is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("step {step} ({op}): {problem}")]
pub struct ScheduleError {
    pub step: usize,
    pub op: String,
    pub problem: String,
}

/// Executes `ops` on `chain` (sizes in bytes); with `budget`, also fails
/// when the memory in use would exceed it.
pub fn simulate(chain: &Chain, ops: &[Op], budget: Option<u64>) -> Result<Outcome, ScheduleError> {
    run(&chain.arrays(), ops, budget)
}

pub(crate) fn run(a: &Arrays, ops: &[Op], budget: Option<u64>) -> Result<Outcome, ScheduleError> {
    let n = a.fw.len(); // stages including the loss
    let mut x_plain = vec![false; n + 2];
    let mut saved = vec![false; n + 2];
    let mut grad = vec![false; n + 2];
    x_plain[0] = true;
    grad[n] = true; // the gradient flowing into the loss: 0 bytes
    let mut mem = a.x[0];
    let mut peak = mem;
    let mut time = 0.0;
    let mut forwards = 0usize;
    for (step, &op) in ops.iter().enumerate() {
        let err = |problem: String| ScheduleError { step, op: op.to_string(), problem };
        let (i, during) = match op {
            Op::Fck(i) | Op::Fn(i) | Op::Fall(i) | Op::B(i) if i >= n => {
                return Err(err(format!("no stage {i}: the chain has {} stages and the loss", n - 1)))
            }
            Op::Fck(i) | Op::Fn(i) => (i, a.x[i + 1] + a.ftmp[i]),
            Op::Fall(i) => (i, a.xbar[i + 1] + a.ftmp[i]),
            Op::B(i) => (i, a.x[i] + a.btmp[i]),
        };
        match op {
            Op::Fck(_) | Op::Fall(_) if !(x_plain[i] || saved[i]) => {
                return Err(err(format!("the input of stage {i} is not in memory")))
            }
            Op::Fn(_) if !x_plain[i] => return Err(err(format!("the input of stage {i} is not kept on its own"))),
            Op::B(_) if !saved[i + 1] => return Err(err(format!("stage {i} has not saved what its backward needs"))),
            Op::B(_) if !grad[i + 1] => {
                return Err(err(format!("the gradient of stage {i}'s output is not there yet")))
            }
            _ => {}
        }
        peak = peak.max(mem + during);
        if let Some(b) = budget {
            if mem + during > b {
                return Err(err(format!("needs {} bytes, over the budget of {b}", mem + during)));
            }
        }
        match op {
            Op::Fck(_) | Op::Fn(_) => {
                if x_plain[i + 1] || saved[i + 1] {
                    return Err(err(format!("the output of stage {i} is already in memory")));
                }
                x_plain[i + 1] = true;
                mem += a.x[i + 1];
                if matches!(op, Op::Fn(_)) {
                    x_plain[i] = false;
                    mem -= a.x[i];
                }
                time += a.fw[i];
                forwards += 1;
            }
            Op::Fall(_) => {
                if saved[i + 1] || x_plain[i + 1] {
                    return Err(err(format!("the output of stage {i} is already in memory")));
                }
                saved[i + 1] = true;
                mem += a.xbar[i + 1];
                time += a.fw[i];
                forwards += 1;
            }
            Op::B(_) => {
                saved[i + 1] = false;
                grad[i + 1] = false;
                mem -= a.xbar[i + 1] + a.x[i + 1];
                if x_plain[i] {
                    x_plain[i] = false;
                    mem -= a.x[i];
                }
                if grad[i] {
                    return Err(err(format!("the gradient of stage {i}'s input is already there")));
                }
                grad[i] = true;
                mem += a.x[i];
                time += a.bw[i];
            }
        }
    }
    let leftover = (0..n + 1).any(|k| x_plain[k] || saved[k] || (k > 0 && grad[k]));
    if !grad[0] || leftover {
        return Err(ScheduleError {
            step: ops.len(),
            op: "end".into(),
            problem: "the schedule does not end with only the input's gradient in memory".into(),
        });
    }
    Ok(Outcome { time, peak, recomputations: forwards.saturating_sub(n) })
}

/// A schedule as text: `Fck0 Fn1 Fall2 B2 …`.
pub fn format_ops(ops: &[Op]) -> String {
    ops.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_all_takes_forward_plus_backward_and_checks_prerequisites() {
        let c = Chain::homogeneous(2, 1.0, 2.0, 10, 30);
        let ops = [Op::Fall(0), Op::Fall(1), Op::Fall(2), Op::B(2), Op::B(1), Op::B(0)];
        let o = simulate(&c, &ops, None).unwrap();
        assert_eq!(o.time, 6.0);
        // During B(1): x0, both tapes, the gradient of a2 and the new gradient of a1.
        assert_eq!(o.peak, 10 + 30 + 30 + 10 + 10);
        assert_eq!(o.recomputations, 0);
        assert!(simulate(&c, &ops, Some(89)).unwrap_err().problem.contains("over the budget"));
        assert!(simulate(&c, &ops, Some(90)).is_ok());
        let missing = [Op::Fall(0), Op::B(0)];
        assert!(simulate(&c, &missing, None).unwrap_err().problem.contains("gradient"));
        let incomplete = [Op::Fall(0), Op::Fall(1), Op::Fall(2), Op::B(2), Op::B(1)];
        assert!(simulate(&c, &incomplete, None).is_err());
    }
}
