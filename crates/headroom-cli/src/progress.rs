//! Progress on standard error for work that takes more than a second: the
//! bar appears only once a second has passed (short runs stay quiet) and
//! only on a terminal (indicatif's default target hides itself otherwise).

use indicatif::{ProgressBar, ProgressStyle};
use std::time::{Duration, Instant};

/// A bar that shows itself after the first second.
pub struct LazyBar {
    start: Instant,
    bar: Option<ProgressBar>,
    unit: &'static str,
}

impl LazyBar {
    /// `unit` names what is counted ("ops"; empty for a percentage).
    pub fn new(unit: &'static str) -> LazyBar {
        LazyBar { start: Instant::now(), bar: None, unit }
    }

    /// `done` of `total` in the phase `message`.
    pub fn update(&mut self, message: &str, done: u64, total: u64) {
        if self.bar.is_none() && self.start.elapsed() >= Duration::from_secs(1) {
            let template = if self.unit.is_empty() {
                "{msg} {bar:40} {percent}% ({eta} left)".to_string()
            } else {
                format!("{{msg}} {{bar:40}} {{pos}}/{{len}} {} ({{eta}} left)", self.unit)
            };
            let bar = ProgressBar::new(total);
            bar.set_style(ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()));
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            if bar.length() != Some(total) {
                bar.set_length(total);
            }
            bar.set_message(message.to_string());
            bar.set_position(done);
        }
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for LazyBar {
    fn drop(&mut self) {
        self.finish();
    }
}
