//! The fragmenter's progress on the terminal while it shapes memory (`fraglab fragment`, `fraglab
//! run`'s fragment phase).

use fraglab_fragmenter::fragment::Progress;
use fraglab_units::format_size;
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar for shaping, cleared when dropped.
pub fn progress_bar() -> impl FnMut(Progress) {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg:12} [{bar:40}] {binary_bytes}/{binary_total_bytes} {elapsed}")
            .expect("static template"),
    );
    let guard = ClearOnDrop(bar.clone());
    move |p| {
        let _keep = &guard;
        match p {
            Progress::Populating { done, total } => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message("populating");
            }
            Progress::Cutting => bar.set_message("cutting"),
            Progress::Freeing { .. } => bar.set_message("freeing"),
            Progress::Settling => bar.set_message("settling"),
            Progress::Filling { bytes, leftover_pages } => {
                bar.set_message(format!(
                    "filling ({} left at order ≥ k)",
                    format_size(leftover_pages * fraglab_fragmenter::arena::PAGE_SIZE as u64)
                ));
                bar.set_position(bytes);
            }
            Progress::Rebreaking { bytes, leftover_pages } => {
                bar.set_message(format!(
                    "re-breaking ({} left at order ≥ k)",
                    format_size(leftover_pages * fraglab_fragmenter::arena::PAGE_SIZE as u64)
                ));
                bar.set_position(bytes);
            }
        }
    }
}

struct ClearOnDrop(ProgressBar);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
