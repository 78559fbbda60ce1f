//! A controller that changes the cluster set at scheduled instants: a
//! scenario's planned spinups and teardowns, and the tuner's scheduled
//! spinups.

use std::collections::VecDeque;

use crate::model::Pool;
use crate::route::RoutingPolicy;
use crate::sim::{ClusterCommand, Controller, Observation};
use crate::time::Instant;

/// Issues each command at its scheduled instant, in time order.
#[derive(Clone, Debug, Default)]
pub struct ScriptedController {
    schedule: VecDeque<(Instant, ClusterCommand)>,
    due: VecDeque<ClusterCommand>,
}

impl ScriptedController {
    /// A controller for `schedule` (any order; equal instants keep their
    /// order).
    pub fn new(mut schedule: Vec<(Instant, ClusterCommand)>) -> Self {
        schedule.sort_by_key(|(at, _)| *at);
        ScriptedController { schedule: schedule.into(), due: VecDeque::new() }
    }
}

impl Controller for ScriptedController {
    fn handle_observation(&mut self, _now: Instant, _observation: Observation<'_>, _pool: &Pool, _router: &dyn RoutingPolicy) {}

    fn poll_timeout(&self) -> Option<Instant> {
        self.schedule.front().map(|(at, _)| *at)
    }

    fn handle_timeout(&mut self, now: Instant, _pool: &Pool, _router: &dyn RoutingPolicy) {
        while let Some((at, _)) = self.schedule.front() {
            if *at > now {
                break;
            }
            let (_, command) = self.schedule.pop_front().expect("front exists");
            self.due.push_back(command);
        }
    }

    fn poll_command(&mut self) -> Option<ClusterCommand> {
        self.due.pop_front()
    }
}
