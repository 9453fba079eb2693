//! Named actions: every key the cockpit reacts to maps to one of these through the keymap.
macro_rules! actions {
    ($($variant:ident => $name:literal, $help:literal;)*) => {
        /// A command the user can bind to keys (`assets/keymap.toml`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Action { $($variant),* }

        impl Action {
            pub const ALL: &'static [Action] = &[$(Action::$variant),*];
            pub fn name(self) -> &'static str {
                match self { $(Action::$variant => $name),* }
            }
            pub fn help(self) -> &'static str {
                match self { $(Action::$variant => $help),* }
            }
        }
    };
}

actions! {
    Quit => "quit", "quit the cockpit (runs keep going)";
    Back => "back", "close, go back; on Home: quit";
    Help => "help", "this help";
    Command => "command", "command line (:run RECIPE k=v, :open RUN, :kill, :layout NAME, :q)";
    Filter => "filter", "filter runs (Home) or search logs (Run)";
    FocusNext => "focus_next", "focus the next panel";
    FocusPrev => "focus_prev", "focus the previous panel";
    Up => "up", "move up / scroll up";
    Down => "down", "move down / scroll down";
    PageUp => "page_up", "page up";
    PageDown => "page_down", "page down";
    Top => "top", "first row";
    Bottom => "bottom", "last row (logs: follow again)";
    Open => "open", "open the selected run";
    Select => "select", "mark a run for compare";
    Compare => "compare", "compare the marked runs' loss";
    Kill => "kill", "kill the run (asks first)";
    Sort => "sort", "sort runs by the next column";
    SortReverse => "sort_reverse", "reverse the sort order";
    Zoom => "zoom", "focused panel full screen (toggle)";
    ToggleEma => "toggle_ema", "chart: EMA smoothing on/off";
    ToggleLogY => "toggle_log_y", "chart: log-scale y on/off";
    ToggleAxis => "toggle_axis", "chart: x axis step / wall time";
    TogglePerRank => "toggle_per_rank", "chart: per-rank lines on/off";
    NextMetric => "next_metric", "chart: next metric";
    NextGroup => "next_group", "matrix: a torch job's next process group (all ranks, then each group)";
    Follow => "follow", "logs: follow the tail on/off";
    NextLogRank => "next_log_rank", "logs: next rank (merged, 0, 1, ...)";
    PrevLogRank => "prev_log_rank", "logs: previous rank";
    Stacks => "stacks", "stacks of the selected rank (dumped off the UI; grouped)";
    StacksAll => "stacks_all", "stacks of every rank, grouped; the odd one out marked";
    StacksNative => "stacks_native", "stacks of the selected rank, C/C++ frames too";
    Incident => "incident", "the run's newest incident report (verdict, timeline, stacks)";
    Export => "export", "export the run (csv, jsonl, tensorboard, parquet) into ./NAME-ID-FORMAT";
    Report => "report", "write the run's report with charts into ./NAME-ID-report";
    RecipePicker => "recipe_picker", "launch a recipe from recipes/";
    Refresh => "refresh", "reload from the server";
    Checkpoints => "checkpoints", "checkpoints of the selected or open run";
    Resume => "resume", "resume from a checkpoint: the selected, else newest verified (asks)";
    Stop => "stop", "graceful stop: checkpoint, then exit (asks first)";
    Verify => "verify", "checkpoints: verify every byte (sha256)";
    Layout1 => "layout_1", "layout 1";
    Layout2 => "layout_2", "layout 2";
    Layout3 => "layout_3", "layout 3";
    Layout4 => "layout_4", "layout 4";
    Layout5 => "layout_5", "layout 5";
    Layout6 => "layout_6", "layout 6";
    Layout7 => "layout_7", "layout 7";
    Layout8 => "layout_8", "layout 8";
    Layout9 => "layout_9", "layout 9";
}

impl Action {
    /// Where a list cursor at `cursor` goes in a list of `n` rows (`page` rows a screen); None
    /// for an action that does not move a cursor.
    pub fn move_cursor(self, cursor: usize, n: usize, page: usize) -> Option<usize> {
        let last = n.saturating_sub(1);
        Some(match self {
            Action::Up => cursor.saturating_sub(1),
            Action::Down => (cursor + 1).min(last),
            Action::PageUp => cursor.saturating_sub(page),
            Action::PageDown => (cursor + page).min(last),
            Action::Top => 0,
            Action::Bottom => last,
            _ => return None,
        })
    }

    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.iter().copied().find(|a| a.name() == name)
    }

    /// For `layout_N`: N - 1.
    pub fn layout_index(self) -> Option<usize> {
        let all = [
            Action::Layout1,
            Action::Layout2,
            Action::Layout3,
            Action::Layout4,
            Action::Layout5,
            Action::Layout6,
            Action::Layout7,
            Action::Layout8,
            Action::Layout9,
        ];
        all.iter().position(|a| *a == self)
    }
}
