//! Evaluation scenarios: built-in ones and TOML files.
//!
//! A scenario names one or more workloads, one or more κ, one or more
//! cluster sets, and the policies to compare. Its cases are the cross
//! product of workloads × κ × cluster sets; every policy runs on every case
//! with the same queries, seed and world.
//!
//! ```toml
//! name = "my-eval"
//! seed = 7                       # optional; --seed overrides
//! kappa = [2.0, 4.0]             # or a single number; traces carry
//!                                # their own SLOs and need none
//! clusters = [[16, 16], [32, 16]] # or a single list, e.g. [16, 16]
//! policies = ["round-robin", "least-loaded"]
//!
//! [[workload]]
//! kind = "base"                  # base | phased | diurnal | shape | trace
//! rate_per_s = 0.1
//!
//! [[workload]]
//! kind = "trace"
//! path = "trace.csv"             # relative to the scenario file; its slo_s
//!                                # column is used as is (κ does not apply)
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use slogate_world::catalog::tpcds_template_set;
use slogate_core::model::Template;
use slogate_core::route::budget::BudgetConfig;
use slogate_loadgen::shapes::{self, Shape};
use slogate_loadgen::trace::read_trace;
use slogate_loadgen::workload::{self, DiurnalConfig, TraceEntry};

use crate::config::{AutoscaleSection, TuneSection};
use crate::{Error, Result};

/// One value or a list of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// A single value.
    One(T),
    /// Several values.
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    /// The values as a list.
    pub fn to_vec(&self) -> Vec<T> {
        match self {
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// A workload specification.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkloadSpec {
    /// BaseWorkload(λ).
    Base {
        /// λ, queries per second.
        rate_per_s: f64,
    },
    /// A phased BaseWorkload.
    Phased {
        /// Queries per slow phase (λ = 0.05).
        low_queries: usize,
        /// λ of the 10-query fast phases.
        high_rate_per_s: f64,
    },
    /// The multi-day diurnal workload.
    Diurnal(DiurnalConfig),
    /// A shape the papers' scenarios lack (`slogate_loadgen::shapes`):
    /// `shape = "flash_crowd"`, `"mix_shift"`, `"multi_tenant"`,
    /// `"rate_drift"` or `"heavy_tailed"`, with its parameters.
    Shape(Shape),
    /// A trace file in the `arrival_s,template,slo_s` format.
    Trace {
        /// The file, relative to the scenario file.
        path: PathBuf,
    },
}

impl WorkloadSpec {
    /// A short label for reports.
    pub fn label(&self) -> String {
        match self {
            WorkloadSpec::Base { rate_per_s } => format!("base(λ={rate_per_s})"),
            WorkloadSpec::Phased { low_queries, high_rate_per_s } => {
                format!("phased(x={low_queries},λ_high={high_rate_per_s})")
            }
            WorkloadSpec::Diurnal(c) => format!("diurnal({}d)", c.days),
            WorkloadSpec::Shape(shape) => shape.label(),
            WorkloadSpec::Trace { path } => format!("trace({})", path.display()),
        }
    }

    /// Whether it is a trace, which carries its own SLOs (κ does not
    /// apply).
    pub fn is_trace(&self) -> bool {
        matches!(self, WorkloadSpec::Trace { .. })
    }

    /// The κ values its cases take: `None` once for a trace, each of
    /// `kappas` otherwise.
    pub fn case_kappas(&self, kappas: &[f64]) -> Vec<Option<f64>> {
        if self.is_trace() { vec![None] } else { kappas.iter().copied().map(Some).collect() }
    }

    /// Generates the workload; SLOs from κ unless it is a trace.
    ///
    /// # Errors
    ///
    /// A generated workload without κ, bad parameters, or an unreadable
    /// trace.
    pub fn generate(&self, templates: &[Template], kappa: Option<f64>, seed: u64, base_dir: &Path) -> Result<Vec<TraceEntry>> {
        let mut entries = match self {
            WorkloadSpec::Base { rate_per_s } => workload::base_workload(templates, *rate_per_s, seed)?,
            WorkloadSpec::Phased { low_queries, high_rate_per_s } => {
                workload::phased_workload(templates, *low_queries, *high_rate_per_s, seed)?
            }
            WorkloadSpec::Diurnal(config) => {
                let mut config = config.clone();
                config.seed ^= seed;
                workload::diurnal_workload(templates, &config)?
            }
            WorkloadSpec::Trace { path } => return Ok(read_trace(&base_dir.join(path))?),
            WorkloadSpec::Shape(shape) => {
                let kappa = kappa.ok_or_else(|| Error::Scenario(format!("workload {} needs κ for its SLOs", self.label())))?;
                return Ok(shapes::generate(shape, templates, kappa, seed)?);
            }
        };
        let kappa = kappa.ok_or_else(|| Error::Scenario(format!("workload {} needs κ for its SLOs", self.label())))?;
        workload::assign_slos(&mut entries, templates, kappa)?;
        Ok(entries)
    }
}

/// What a scenario file without `policies` compares: the SLO-blind
/// baselines and slogate.
pub const DEFAULT_FILE_POLICIES: [&str; 3] = ["round-robin", "least-loaded", "slogate"];

fn default_file_policies() -> Vec<String> {
    DEFAULT_FILE_POLICIES.iter().map(|p| (*p).to_owned()).collect()
}

/// A scenario as written in TOML.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// The scenario's name in reports.
    pub name: String,
    /// Default seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// SLO tightness κ: `SLO = κ × ℓ_baseline`. Required unless every
    /// workload is a trace (a trace carries its SLOs).
    #[serde(default)]
    pub kappa: Option<OneOrMany<f64>>,
    /// Cluster sets (sizes in RPU), each a case.
    pub clusters: OneOrMany<Vec<u32>>,
    /// Policies to compare; [`DEFAULT_FILE_POLICIES`] when left out
    /// (`eval --policies` overrides either).
    #[serde(default = "default_file_policies")]
    pub policies: Vec<String>,
    /// Workloads, each a case.
    pub workload: Vec<WorkloadSpec>,
    /// Autoscaling for the policies that can plan (slogate, stage-cost),
    /// with the keys of a node's `[pool.autoscale]`; the others run on
    /// the fixed clusters.
    #[serde(default)]
    pub autoscale: Option<AutoscaleSection>,
    /// The policy tuner, with the keys of a node's `[pool.tune]`: the
    /// policies that can plan run each workload's last day with the
    /// configuration tuned from the days before it (see
    /// [`super::tuned`]). Needs `[autoscale]`.
    #[serde(default)]
    pub tune: Option<TuneSection>,
    /// The violation budget the SLO-aware policies spend on cost, with
    /// the keys of a node's `[pool.violation_budget]`.
    #[serde(default)]
    pub violation_budget: Option<BudgetConfig>,
}

/// A validated scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// Default seed.
    pub seed: u64,
    /// κ values (empty when every workload is a trace).
    pub kappas: Vec<f64>,
    /// Cluster sets.
    pub cluster_sets: Vec<Vec<u32>>,
    /// Policy names.
    pub policies: Vec<String>,
    /// Workloads.
    pub workloads: Vec<WorkloadSpec>,
    /// Where relative trace paths are resolved.
    pub base_dir: PathBuf,
    /// Autoscaling for the policies that can plan, if enabled.
    pub autoscale: Option<AutoscaleSection>,
    /// The tuner, if enabled: every case runs its workload's last day.
    pub tune: Option<TuneSection>,
    /// The violation budget the SLO-aware policies spend, if any.
    pub violation_budget: Option<BudgetConfig>,
}

/// The built-in scenario names (besides `calibrate`, which is a report).
pub const BUILT_IN: [&str; 4] = ["base", "router-table2", "shapes-dev", "shapes-held-out"];

/// The policies the shape scenarios compare: the SLO-blind baselines,
/// Spandana's directors and slogate.
const SHAPE_POLICIES: [&str; 5] = ["round-robin", "least-loaded", "spandana", "spandana-central", "slogate"];

/// The shapes decisions may be developed on (with seeds 1..5).
pub const DEVELOPMENT_SHAPES: [&str; 3] = ["flash_crowd", "mix_shift", "multi_tenant"];

/// The first held-out seed: `shapes-held-out` runs seeds 101..105 by
/// default, on every shape, two of which (`rate_drift`, `heavy_tailed`)
/// the development set never has. Nothing is tuned on them.
pub const HELD_OUT_FIRST_SEED: u64 = 101;

impl Scenario {
    /// A built-in scenario by name.
    pub fn built_in(name: &str) -> Option<Scenario> {
        match name {
            "base" => Some(Scenario {
                name: "base".into(),
                seed: 1,
                kappas: vec![4.0],
                cluster_sets: vec![vec![16, 16]],
                policies: vec!["round-robin".into(), "least-loaded".into()],
                workloads: vec![WorkloadSpec::Base { rate_per_s: 0.1 }],
                base_dir: PathBuf::from("."),
                autoscale: None,
                tune: None,
                violation_budget: None,
            }),
            "router-table2" => Some(Scenario {
                name: "router-table2".into(),
                seed: 1,
                kappas: vec![4.0, 2.0],
                cluster_sets: vec![vec![32, 16], vec![16, 16]],
                policies: vec!["round-robin".into(), "stage-cost".into(), "slogate".into()],
                workloads: vec![WorkloadSpec::Base { rate_per_s: 0.1 }, WorkloadSpec::Base { rate_per_s: 0.2 }],
                base_dir: PathBuf::from("."),
                autoscale: None,
                tune: None,
                violation_budget: None,
            }),
            "shapes-dev" | "shapes-held-out" => {
                let held_out = name == "shapes-held-out";
                let shapes: Vec<Shape> = if held_out {
                    Shape::all_defaults()
                } else {
                    DEVELOPMENT_SHAPES.iter().map(|n| Shape::by_name(n).expect("known shape")).collect()
                };
                Some(Scenario {
                    name: name.into(),
                    seed: if held_out { HELD_OUT_FIRST_SEED } else { 1 },
                    kappas: vec![4.0, 2.0],
                    cluster_sets: vec![vec![16, 16]],
                    policies: SHAPE_POLICIES.iter().map(|p| (*p).to_owned()).collect(),
                    workloads: shapes.into_iter().map(WorkloadSpec::Shape).collect(),
                    base_dir: PathBuf::from("."),
                    autoscale: None,
                    tune: None,
                    violation_budget: None,
                })
            }
            _ => None,
        }
    }

    /// Parses and validates a TOML scenario; `base_dir` resolves trace
    /// paths.
    pub fn from_toml(text: &str, base_dir: &Path) -> Result<Scenario> {
        let file: ScenarioFile = toml::from_str(text).map_err(|e| Error::Scenario(e.to_string()))?;
        let scenario = Scenario {
            name: file.name,
            seed: file.seed.unwrap_or(1),
            kappas: file.kappa.map(|k| k.to_vec()).unwrap_or_default(),
            cluster_sets: file.clusters.to_vec(),
            policies: file.policies,
            workloads: file.workload,
            base_dir: base_dir.to_path_buf(),
            autoscale: file.autoscale.filter(|a| a.enabled),
            tune: file.tune.filter(|t| t.enabled),
            violation_budget: file.violation_budget,
        };
        scenario.validate()?;
        Ok(scenario)
    }

    /// Loads a scenario file.
    pub fn from_path(path: &Path) -> Result<Scenario> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Scenario(format!("cannot read scenario file {}: {e}", path.display())))?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Scenario::from_toml(&text, &base_dir).map_err(|e| match e {
            Error::Scenario(reason) => Error::Scenario(format!("{}: {reason}", path.display())),
            other => other,
        })
    }

    /// Checks ranges and names.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::Scenario(reason));
        if self.kappas.iter().any(|k| !(k.is_finite() && *k > 0.0)) {
            return bad(format!("kappa must be one or more positive numbers, got {:?}", self.kappas));
        }
        if self.kappas.is_empty()
            && let Some(generated) = self.workloads.iter().find(|w| !w.is_trace())
        {
            return bad(format!("kappa is required: workload {} draws its SLOs as κ × the template's baseline", generated.label()));
        }
        if self.cluster_sets.is_empty() || self.cluster_sets.iter().any(|set| set.is_empty()) {
            return bad("clusters must list at least one cluster size per set".into());
        }
        if let Some(size) = self.cluster_sets.iter().flatten().find(|&&s| s == 0 || s > 1_024) {
            return bad(format!("cluster size {size} RPU is out of range (1–1024)"));
        }
        if self.workloads.is_empty() {
            return bad("a scenario needs at least one [[workload]]".into());
        }
        if self.policies.is_empty() {
            return bad("a scenario needs at least one policy".into());
        }
        for policy in &self.policies {
            super::policy_by_name(policy)?;
        }
        if let Some(autoscale) = &self.autoscale {
            autoscale.to_core("autoscale").map_err(|e| Error::Scenario(e.to_string()))?;
            autoscale.schedule("autoscale").map_err(|e| Error::Scenario(e.to_string()))?;
            if !self.policies.iter().any(|p| super::LEARNED_POLICIES.contains(&p.as_str())) {
                return bad(format!("[autoscale] needs a policy that can plan ({}) among the policies", super::LEARNED_POLICIES.join(", ")));
            }
        }
        if let Some(budget) = &self.violation_budget {
            budget.validate().map_err(|reason| Error::Scenario(format!("[violation_budget]: {reason}")))?;
        }
        if let Some(tune) = &self.tune {
            if self.autoscale.is_none() {
                return bad("[tune] tunes the autoscaler: it needs [autoscale] with enabled = true".into());
            }
            tune.to_core("tune", self.seed).map_err(|e| Error::Scenario(e.to_string()))?;
        }
        Ok(())
    }

    /// The templates scenarios draw from.
    pub fn templates() -> Vec<Template> {
        tpcds_template_set()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_toml_accepts_single_values_and_lists() {
        let text = r#"
            name = "t"
            kappa = 4
            clusters = [16, 16]
            policies = ["round-robin"]
            [[workload]]
            kind = "base"
            rate_per_s = 0.2
        "#;
        let s = Scenario::from_toml(text, Path::new(".")).unwrap();
        assert_eq!(s.kappas, vec![4.0]);
        assert_eq!(s.cluster_sets, vec![vec![16, 16]]);
        let text = text.replace("kappa = 4", "kappa = [2, 4]").replace("clusters = [16, 16]", "clusters = [[16, 16], [32, 16]]");
        let s = Scenario::from_toml(&text, Path::new(".")).unwrap();
        assert_eq!(s.kappas.len(), 2);
        assert_eq!(s.cluster_sets.len(), 2);
    }

    #[test]
    fn a_scenario_without_policies_compares_the_baselines_with_slogate() {
        let text = "name='t'\nclusters=[16, 16]\n[[workload]]\nkind='trace'\npath='t.csv'\n";
        let s = Scenario::from_toml(text, Path::new(".")).unwrap();
        assert_eq!(s.policies, vec!["round-robin", "least-loaded", "slogate"]);
        let s = Scenario::from_toml(&format!("policies=['least-loaded']\n{text}"), Path::new(".")).unwrap();
        assert_eq!(s.policies, vec!["least-loaded"], "a file's own list wins");
    }

    #[test]
    fn unknown_fields_and_policies_are_named() {
        let text = "name='t'\nkappa=4\nclusters=[16]\npolicies=['round-robin']\ncolour='red'\n[[workload]]\nkind='base'\nrate_per_s=0.1\n";
        assert!(Scenario::from_toml(text, Path::new(".")).unwrap_err().to_string().contains("colour"));
        let text = "name='t'\nkappa=4\nclusters=[16]\npolicies=['fastest']\n[[workload]]\nkind='base'\nrate_per_s=0.1\n";
        assert!(Scenario::from_toml(text, Path::new(".")).unwrap_err().to_string().contains("unknown policy `fastest`"));
    }

    #[test]
    fn shape_workloads_parse_with_defaults_and_overrides() {
        let text = "name='t'\nkappa=4\nclusters=[16]\npolicies=['round-robin']\n[[workload]]\nkind='shape'\nshape='flash_crowd'\ncrowd_rate_per_s=0.3\n[[workload]]\nkind='shape'\nshape='heavy_tailed'\n";
        let s = Scenario::from_toml(text, Path::new(".")).unwrap();
        assert!(matches!(&s.workloads[0], WorkloadSpec::Shape(Shape::FlashCrowd { crowd_rate_per_s, .. }) if *crowd_rate_per_s == 0.3));
        assert_eq!(s.workloads[1], WorkloadSpec::Shape(Shape::by_name("heavy_tailed").unwrap()));
        let bad = text.replace("crowd_rate_per_s=0.3", "crowd_colour=1");
        assert!(Scenario::from_toml(&bad, Path::new(".")).unwrap_err().to_string().contains("crowd_colour"));
    }

    #[test]
    fn autoscale_takes_the_node_keys_and_names_bad_ones() {
        let base = "name='t'\nkappa=4\nclusters=[16]\npolicies=['least-loaded','slogate']\n[[workload]]\nkind='base'\nrate_per_s=0.1\n";
        let s = Scenario::from_toml(&format!("{base}[autoscale]\nenabled=true\nidle_teardown_s=600\n[[autoscale.scheduled]]\nat_s=3600\nsize=32\n"), Path::new(".")).unwrap();
        let autoscale = s.autoscale.unwrap();
        assert_eq!((autoscale.idle_teardown_s, autoscale.scheduled.len()), (600, 1));
        let off = Scenario::from_toml(&format!("{base}[autoscale]\nenabled=false\n"), Path::new(".")).unwrap();
        assert!(off.autoscale.is_none());
        let bad = Scenario::from_toml(&format!("{base}[autoscale]\nenabled=true\n[[autoscale.scheduled]]\nat_s=90000\nsize=32\n"), Path::new(".")).unwrap_err();
        assert!(bad.to_string().contains("autoscale.scheduled[0].at_s"), "{bad}");
        let unknown = Scenario::from_toml(&format!("{base}[autoscale]\nenabled=true\nsped=1\n"), Path::new(".")).unwrap_err();
        assert!(unknown.to_string().contains("sped"), "{unknown}");
        let blind = base.replace("'least-loaded','slogate'", "'least-loaded'");
        let err = Scenario::from_toml(&format!("{blind}[autoscale]\nenabled=true\n"), Path::new(".")).unwrap_err();
        assert!(err.to_string().contains("needs a policy that can plan"), "{err}");
    }

    #[test]
    fn a_violation_budget_takes_the_node_keys_and_names_bad_ones() {
        let base = "name='t'\nkappa=4\nclusters=[16]\npolicies=['slogate']\n[[workload]]\nkind='base'\nrate_per_s=0.1\n";
        assert_eq!(Scenario::from_toml(base, Path::new(".")).unwrap().violation_budget, None);
        let s = Scenario::from_toml(&format!("{base}[violation_budget]\ntarget=0.05\nwindow=64\n"), Path::new(".")).unwrap();
        assert_eq!(s.violation_budget, Some(BudgetConfig { target: 0.05, window: 64, ..BudgetConfig::default() }));
        let bad = Scenario::from_toml(&format!("{base}[violation_budget]\ntarget=0\n"), Path::new(".")).unwrap_err();
        assert!(bad.to_string().contains("[violation_budget]: violation budget target must be in (0, 1), got 0"), "{bad}");
        let unknown = Scenario::from_toml(&format!("{base}[violation_budget]\ntarget=0.05\nslack=1\n"), Path::new(".")).unwrap_err();
        assert!(unknown.to_string().contains("slack"), "{unknown}");
    }

    #[test]
    fn kappa_is_optional_when_every_workload_is_a_trace() {
        let traces = "name='t'\nclusters=[16]\npolicies=['round-robin']\n[[workload]]\nkind='trace'\npath='t.csv'\n";
        let s = Scenario::from_toml(traces, Path::new(".")).unwrap();
        assert!(s.kappas.is_empty());
        assert_eq!(s.workloads[0].case_kappas(&[2.0, 4.0]), vec![None], "a trace is one case whatever κ says");
        let generated = "name='t'\nclusters=[16]\npolicies=['round-robin']\n[[workload]]\nkind='base'\nrate_per_s=0.1\n";
        let err = Scenario::from_toml(generated, Path::new(".")).unwrap_err().to_string();
        assert!(err.contains("kappa is required") && err.contains("base(λ=0.1)"), "{err}");
    }

    #[test]
    fn out_of_range_values_are_rejected() {
        let text = "name='t'\nkappa=-1\nclusters=[16]\npolicies=['round-robin']\n[[workload]]\nkind='base'\nrate_per_s=0.1\n";
        assert!(Scenario::from_toml(text, Path::new(".")).unwrap_err().to_string().contains("kappa"));
        let text = "name='t'\nkappa=2\nclusters=[0]\npolicies=['round-robin']\n[[workload]]\nkind='base'\nrate_per_s=0.1\n";
        assert!(Scenario::from_toml(text, Path::new(".")).unwrap_err().to_string().contains("out of range"));
    }
}
