//! The workload forecaster (AutoSLO §7.2): forecasted days drawn from the
//! reservoir's count and arrivals tables.
//!
//! For each hour of the target day it looks at the same hour of earlier
//! days (the **bins**) that the history covers:
//!
//! - [`ForecastMethod::WeeklyDecay`] (the default): the same weekday and
//!   hour of past weeks, `k` weeks ago weighted `λ^(k−1)`. When the history
//!   holds no same-weekday day (less than a week of it), the most recent
//!   day stands in, so that one day of history already informs the tuner;
//! - [`ForecastMethod::PreviousDay`]: the day before only;
//! - [`ForecastMethod::Window`]: the last `days` days, equally weighted.
//!
//! An hour's query count is the bins' weighted mean count, times a
//! **day-to-day ratio**, rounded at random to an integer (keeping the
//! mean). The ratios say how far a day's hour strays from its kind: for
//! every hour whose bins hold at least [`RATIO_MIN_MEAN_COUNT`] arrivals
//! on the mean, each bin's count over the bins' plain mean, its deviation
//! from 1 widened by `√(n/(n−1))` for `n` bins (a mean of `n` counts sits
//! closer to them than the kind's mean does). Each hour draws one of the
//! pooled ratios; with a single bin (one day of history, or the previous
//! day alone) there are none and the ratio is 1. The ratios take the bins
//! as days of one kind, as the method's mean does: the same weekday's for
//! `WeeklyDecay`; with `Window`, a weekend among weekdays widens them. Without them every
//! forecast of a day would carry the same count in each hour, so the tuner
//! would plan for the average morning and never for a busy one. Each query's template is drawn
//! from the bins' counts, each past query weighted by its bin's weight.
//! Arrival times come from the bins' **interarrival deciles**: a gap is drawn
//! by picking one of the ten decile ranges uniformly and a point uniformly
//! inside it; the hour's `n` arrivals start at one of the bins' arrival
//! offsets (drawn uniformly) and follow by running sums of such gaps,
//! wrapping around the hour, which keeps both where in the hour the load
//! comes and how bursty it is. Bins with fewer than 11 arrivals in all give
//! too few gaps for deciles, and their arrivals fall uniformly in the hour.
//! Gaps of a sampled hour (the reservoir keeps at most a bounded sample of
//! offsets) are scaled by the sampled fraction.
//!
//! [`forecast`] draws `scenarios` days with independent seeds and splits
//! them into disjoint training and validation sets.
//!
//! # Properties
//!
//! - (A) Every arrival lies within its hour, and a day's arrivals are
//!   sorted.
//! - (B) Only templates seen in the bins are drawn, and only hours whose
//!   bins saw arrivals get any.
//! - (C) The same reservoir, day, configuration and seed give the same
//!   forecasts.
//! - (D) Every day-to-day ratio is at least 0, and with one bin there are
//!   none: the forecast then draws exactly as it would without them.

use std::ops::Range;

use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::{Deserialize, Serialize};

use crate::model::TemplateId;
use crate::reservoir::{CalendarHour, Reservoir};
use crate::time::Duration;

/// Which past days inform a forecast hour.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum ForecastMethod {
    /// Same weekday and hour of past weeks, `k` weeks ago weighted
    /// `lambda^(k−1)`.
    WeeklyDecay {
        /// λ in (0, 1].
        lambda: f64,
    },
    /// The previous day only.
    PreviousDay,
    /// The last `days` days, equally weighted.
    Window {
        /// How many.
        days: u32,
    },
}

/// The forecaster's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ForecastConfig {
    /// Which bins.
    pub method: ForecastMethod,
    /// Forecasted days to draw.
    pub scenarios: usize,
    /// Share of them for training; the rest validate.
    pub training_share: f64,
    /// Seeds the draws.
    pub seed: u64,
}

impl Default for ForecastConfig {
    fn default() -> Self {
        ForecastConfig { method: ForecastMethod::WeeklyDecay { lambda: 0.25 }, scenarios: 20, training_share: 0.6, seed: 1 }
    }
}

/// One forecasted day: arrivals as offsets from the day's start, sorted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForecastDay {
    /// Days since 1970-01-01 of the day forecast.
    pub day: i32,
    /// `(offset from the day's start, template)`, ascending.
    pub arrivals: Vec<(Duration, TemplateId)>,
}

/// Disjoint training and validation forecasts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Forecasts {
    /// Days the tuner optimises on.
    pub training: Vec<ForecastDay>,
    /// Days it selects on.
    pub validation: Vec<ForecastDay>,
}

/// The bins of `hour` on `day` under `method`, within `history` (days
/// since 1970-01-01, the target day excluded): `(day, weight)`.
pub fn bins(method: ForecastMethod, day: i32, history: &Range<i32>) -> Vec<(i32, f64)> {
    let within = |d: i32| history.contains(&d) && d < day;
    match method {
        ForecastMethod::WeeklyDecay { lambda } => {
            let weekly: Vec<(i32, f64)> =
                (1..).map(|k: i32| (day - 7 * k, lambda.powi(k - 1))).take_while(|(d, _)| *d >= history.start).filter(|(d, _)| within(*d)).collect();
            if weekly.is_empty() { (1..=7).map(|k| day - k).find(|d| within(*d)).map(|d| vec![(d, 1.0)]).unwrap_or_default() } else { weekly }
        }
        ForecastMethod::PreviousDay => [(day - 1, 1.0)].into_iter().filter(|(d, _)| within(*d)).collect(),
        ForecastMethod::Window { days } => (1..=days as i32).map(|k| (day - k, 1.0)).filter(|(d, _)| within(*d)).collect(),
    }
}

/// The hours whose bins hold fewer arrivals than this on the mean give no
/// day-to-day ratios: their counts stray mostly by chance.
pub const RATIO_MIN_MEAN_COUNT: f64 = 10.0;

/// The day-to-day ratios of `bins` (see the module docs), ascending.
pub fn day_to_day_ratios(reservoir: &Reservoir, bins: &[(i32, f64)]) -> Vec<f64> {
    let n = bins.len();
    if n < 2 {
        return Vec::new();
    }
    let widen = (n as f64 / (n - 1) as f64).sqrt();
    let mut ratios = Vec::new();
    for hour in 0..24u8 {
        let counts: Vec<f64> = bins.iter().map(|&(day, _)| reservoir.arrivals_in(CalendarHour { day, hour }).0 as f64).collect();
        let mean = counts.iter().sum::<f64>() / n as f64;
        if mean < RATIO_MIN_MEAN_COUNT {
            continue;
        }
        ratios.extend(counts.iter().map(|c| (1.0 + (c / mean - 1.0) * widen).max(0.0)));
    }
    ratios.sort_by(f64::total_cmp);
    ratios
}

/// What the bins of one hour say.
struct HourModel {
    mean_count: f64,
    /// Cumulative template weights, for drawing.
    templates: Vec<(TemplateId, f64)>,
    /// Interarrival deciles (11 points), or `None` to draw uniformly.
    deciles: Option<[f64; 11]>,
    /// Every bin's sampled offsets, seconds into the hour.
    offsets: Vec<f64>,
}

fn hour_model(reservoir: &Reservoir, hour: u8, bins: &[(i32, f64)]) -> HourModel {
    let total_weight: f64 = bins.iter().map(|(_, w)| w).sum();
    let mut mean_count = 0.0;
    let mut by_template: std::collections::BTreeMap<TemplateId, f64> = std::collections::BTreeMap::new();
    let mut gaps: Vec<f64> = Vec::new();
    let mut offsets: Vec<f64> = Vec::new();
    for &(day, weight) in bins {
        let at = CalendarHour { day, hour };
        let (total, samples) = reservoir.arrivals_in(at);
        mean_count += weight * total as f64 / total_weight.max(f64::MIN_POSITIVE);
        for (template, count) in reservoir.counts_in(at) {
            *by_template.entry(template).or_insert(0.0) += weight * count as f64;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        offsets.extend(sorted.iter().map(|&o| f64::from(o)));
        let thinning = if total == 0 { 1.0 } else { sorted.len() as f64 / total as f64 };
        gaps.extend(sorted.windows(2).map(|w| f64::from(w[1] - w[0]) * thinning));
    }
    let mut cumulative = 0.0;
    let templates = by_template.into_iter().map(|(t, w)| (t, { cumulative += w; cumulative })).collect();
    let deciles = (offsets.len() >= 11 && gaps.len() >= 10).then(|| {
        gaps.sort_by(f64::total_cmp);
        std::array::from_fn(|i| crate::stats::percentile(&gaps, i as f64 / 10.0))
    });
    HourModel { mean_count, templates, deciles, offsets }
}

/// What a day's forecasts are drawn from: each hour's model and the
/// day-to-day ratios, built once for every draw.
struct DayModel {
    day: i32,
    hours: Vec<HourModel>,
    ratios: Vec<f64>,
}

impl DayModel {
    fn new(reservoir: &Reservoir, day: i32, history: &Range<i32>, method: ForecastMethod) -> DayModel {
        let bins = bins(method, day, history);
        DayModel { day, hours: (0..24u8).map(|hour| hour_model(reservoir, hour, &bins)).collect(), ratios: day_to_day_ratios(reservoir, &bins) }
    }

    /// One forecasted day, seeded by `seed`.
    fn draw(&self, seed: u64) -> ForecastDay {
        let mut rng = SmallRng::seed_from_u64(seed ^ (i64::from(self.day) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let ratios = &self.ratios;
        let mut arrivals = Vec::new();
        for (hour, model) in self.hours.iter().enumerate() {
            let Some(&(_, template_weight)) = model.templates.last() else { continue };
            let ratio = if ratios.is_empty() { 1.0 } else { ratios[rng.random_range(0..ratios.len())] };
            let mean_count = model.mean_count * ratio;
            let whole = mean_count.floor();
            let count = whole as usize + usize::from(rng.random::<f64>() < mean_count - whole);
            if count == 0 {
                continue;
            }
            let hour_start = hour as f64 * 3_600.0;
            let offsets: Vec<f64> = match &model.deciles {
                Some(deciles) => {
                    let mut at = model.offsets[rng.random_range(0..model.offsets.len())];
                    (0..count)
                        .map(|k| {
                            if k > 0 {
                                let i = rng.random_range(0..10);
                                let (lo, hi) = (deciles[i], deciles[i + 1]);
                                at = (at + lo + (hi - lo) * rng.random::<f64>()) % 3_600.0;
                            }
                            at
                        })
                        .collect()
                }
                None => (0..count).map(|_| rng.random::<f64>() * 3_600.0).collect(),
            };
            for offset in offsets {
                let pick = rng.random::<f64>() * template_weight;
                let template = model.templates.iter().find(|(_, c)| *c > pick).map_or(model.templates[model.templates.len() - 1].0, |(t, _)| *t);
                arrivals.push((Duration::from_secs_f64(hour_start + offset), template));
            }
        }
        arrivals.sort();
        ForecastDay { day: self.day, arrivals }
    }
}

/// One forecasted `day` from `reservoir`'s `history`, seeded by `seed`.
pub fn forecast_day(reservoir: &Reservoir, day: i32, history: &Range<i32>, method: ForecastMethod, seed: u64) -> ForecastDay {
    DayModel::new(reservoir, day, history, method).draw(seed)
}

/// `config.scenarios` forecasts of `day`, split into training and
/// validation (see the module docs). The hour models are built once for
/// all of them; only the draws differ.
pub fn forecast(reservoir: &Reservoir, day: i32, history: &Range<i32>, config: &ForecastConfig) -> Forecasts {
    let model = DayModel::new(reservoir, day, history, config.method);
    let mut days: Vec<ForecastDay> = (0..config.scenarios as u64).map(|i| model.draw(config.seed.wrapping_mul(1_000_003).wrapping_add(i))).collect();
    let training = ((config.scenarios as f64 * config.training_share).round() as usize).clamp(usize::from(config.scenarios > 0), config.scenarios);
    let validation = days.split_off(training);
    Forecasts { training: days, validation }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::reservoir::ReservoirConfig;

    /// 2024-05-27, a Monday, in days since 1970-01-01.
    const MONDAY: i32 = 19_870;

    fn at(day: i32, hour: u8, offset_s: i64) -> i64 {
        i64::from(day) * 86_400 + i64::from(hour) * 3_600 + offset_s
    }

    /// `count` arrivals of `template` at irregular offsets in the hour.
    fn fill(reservoir: &mut Reservoir, day: i32, hour: u8, template: u32, count: i64) {
        for i in 0..count {
            reservoir.handle_arrival(at(day, hour, (i * 7_919) % 3_600), TemplateId(template));
        }
    }

    #[test]
    fn weekly_bins_decay_by_lambda_and_one_day_of_history_stands_in() {
        let method = ForecastMethod::WeeklyDecay { lambda: 0.25 };
        assert_eq!(bins(method, MONDAY, &(MONDAY - 30..MONDAY)), vec![(MONDAY - 7, 1.0), (MONDAY - 14, 0.25), (MONDAY - 21, 0.0625), (MONDAY - 28, 0.015625)]);
        assert_eq!(bins(method, MONDAY, &(MONDAY - 1..MONDAY)), vec![(MONDAY - 1, 1.0)]);
        assert!(bins(method, MONDAY, &(MONDAY..MONDAY)).is_empty());
        assert_eq!(bins(ForecastMethod::PreviousDay, MONDAY, &(MONDAY - 30..MONDAY)), vec![(MONDAY - 1, 1.0)]);
        assert_eq!(bins(ForecastMethod::Window { days: 7 }, MONDAY, &(MONDAY - 3..MONDAY)).len(), 3);
    }

    #[test]
    fn counts_and_templates_follow_the_weighted_bins() {
        // A week ago: 100 of template 1 at 9:00; two weeks ago: 200 of
        // template 2. λ = 0.25: the hour's mean count is (100 + 0.25·200)/1.25
        // = 120, and a drawn query is template 1 with probability
        // 100/(100 + 50) = 2/3.
        let mut reservoir = Reservoir::new(ReservoirConfig::default());
        fill(&mut reservoir, MONDAY - 7, 9, 1, 100);
        fill(&mut reservoir, MONDAY - 14, 9, 2, 200);
        let method = ForecastMethod::WeeklyDecay { lambda: 0.25 };
        let model = hour_model(&reservoir, 9, &bins(method, MONDAY, &(MONDAY - 14..MONDAY)));
        assert!((model.mean_count - 120.0).abs() < 1e-9, "mean count {}", model.mean_count);
        let config = ForecastConfig { scenarios: 50, ..ForecastConfig::default() };
        let forecasts = forecast(&reservoir, MONDAY, &(MONDAY - 14..MONDAY), &config);
        let days: Vec<&ForecastDay> = forecasts.training.iter().chain(&forecasts.validation).collect();
        let total: usize = days.iter().map(|d| d.arrivals.len()).sum();
        let ones = days.iter().flat_map(|d| &d.arrivals).filter(|(_, t)| *t == TemplateId(1)).count();
        assert!((ones as f64 / total as f64 - 2.0 / 3.0).abs() < 0.03, "{ones} of {total}");
        assert!(days.iter().flat_map(|d| &d.arrivals).all(|(at, _)| (9.0 * 3_600.0..10.0 * 3_600.0).contains(&at.as_secs_f64())));
        // Empty weeks in the history count as hours with no arrivals: with
        // weeks 3 and 4 as well, (100 + 50)/(1 + 0.25 + 0.0625 + 0.015625).
        let longer = hour_model(&reservoir, 9, &bins(method, MONDAY, &(MONDAY - 30..MONDAY)));
        assert!((longer.mean_count - 150.0 / 1.328_125).abs() < 1e-9, "mean count {}", longer.mean_count);
    }

    #[test]
    fn one_bin_gives_no_day_to_day_ratios_and_several_give_each_busy_hour_s_spread() {
        let mut reservoir = Reservoir::new(ReservoirConfig::default());
        fill(&mut reservoir, MONDAY - 7, 9, 1, 100);
        fill(&mut reservoir, MONDAY - 14, 9, 1, 200);
        // Too few at 3:00 to say anything.
        fill(&mut reservoir, MONDAY - 7, 3, 1, 4);
        fill(&mut reservoir, MONDAY - 14, 3, 1, 8);
        let method = ForecastMethod::WeeklyDecay { lambda: 0.25 };
        assert!(day_to_day_ratios(&reservoir, &bins(method, MONDAY, &(MONDAY - 7..MONDAY))).is_empty());
        // 100 and 200 about their mean of 150, widened by √2.
        let ratios = day_to_day_ratios(&reservoir, &bins(method, MONDAY, &(MONDAY - 14..MONDAY)));
        let spread = std::f64::consts::SQRT_2 / 3.0;
        assert_eq!(ratios.len(), 2);
        assert!((ratios[0] - (1.0 - spread)).abs() < 1e-12 && (ratios[1] - (1.0 + spread)).abs() < 1e-12, "{ratios:?}");
    }

    #[test]
    fn forecast_counts_stray_as_the_history_s_days_do_and_not_with_one_day_of_it() {
        // Four past Mondays with 60, 100, 140 and 100 queries at 9:00.
        let mut reservoir = Reservoir::new(ReservoirConfig::default());
        for (week, count) in [(1, 60), (2, 100), (3, 140), (4, 100)] {
            fill(&mut reservoir, MONDAY - 7 * week, 9, 1, count);
        }
        let counts = |history: Range<i32>| -> Vec<f64> {
            (0..200u64).map(|seed| forecast_day(&reservoir, MONDAY, &history, ForecastMethod::WeeklyDecay { lambda: 0.25 }, seed).arrivals.len() as f64).collect()
        };
        let spread = |c: &[f64]| {
            let mean = c.iter().sum::<f64>() / c.len() as f64;
            (c.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / c.len() as f64).sqrt() / mean
        };
        // The ratios' own relative spread is √(2·0.4²/4)·√(4/3) ≈ 0.33.
        let four_weeks = counts(MONDAY - 28..MONDAY);
        assert!((0.25..0.42).contains(&spread(&four_weeks)), "relative spread {}", spread(&four_weeks));
        // One week: the count is the hour's, every time.
        assert!(counts(MONDAY - 7..MONDAY).iter().all(|&c| c == 60.0));
    }

    #[test]
    fn arrivals_follow_the_interarrival_deciles_and_sparse_hours_fall_back_to_uniform() {
        // Bursts: 30 arrivals 1 s apart every 10 minutes. Gaps are mostly
        // 1 s, so most forecast gaps are short too.
        let mut reservoir = Reservoir::new(ReservoirConfig::default());
        for burst in 0..6 {
            for i in 0..30 {
                reservoir.handle_arrival(at(MONDAY - 7, 12, burst * 600 + i), TemplateId(5));
            }
        }
        // Sparse: 3 arrivals at 15:00.
        for i in 0..3 {
            reservoir.handle_arrival(at(MONDAY - 7, 15, i * 10), TemplateId(6));
        }
        let day = forecast_day(&reservoir, MONDAY, &(MONDAY - 7..MONDAY), ForecastMethod::WeeklyDecay { lambda: 0.25 }, 7);
        let noon: Vec<f64> = day.arrivals.iter().filter(|(_, t)| *t == TemplateId(5)).map(|(a, _)| a.as_secs_f64()).collect();
        assert_eq!(noon.len(), 180);
        let short = noon.windows(2).filter(|w| w[1] - w[0] < 5.0).count();
        assert!(short > 120, "{short} of 179 gaps are short");
        let sparse = day.arrivals.iter().filter(|(_, t)| *t == TemplateId(6)).count();
        assert_eq!(sparse, 3);
    }

    #[test]
    fn training_and_validation_are_disjoint_draws_of_the_configured_sizes() {
        let mut reservoir = Reservoir::new(ReservoirConfig::default());
        fill(&mut reservoir, MONDAY - 7, 3, 1, 40);
        let forecasts = forecast(&reservoir, MONDAY, &(MONDAY - 7..MONDAY), &ForecastConfig::default());
        assert_eq!((forecasts.training.len(), forecasts.validation.len()), (12, 8));
        assert_ne!(forecasts.training[0], forecasts.validation[0]);
        assert_eq!(forecasts, forecast(&reservoir, MONDAY, &(MONDAY - 7..MONDAY), &ForecastConfig::default()));
        assert!(forecast(&reservoir, MONDAY, &(MONDAY..MONDAY), &ForecastConfig::default()).training.iter().all(|d| d.arrivals.is_empty()));
    }

    proptest! {
        #[test]
        fn forecast_arrivals_stay_in_their_hours_sorted_and_from_seen_templates(
            history in prop::collection::vec((1i32..15, 0u8..24, 0i64..3_600, 1u32..5), 1..300),
            seed in 0u64..1_000,
        ) {
            let mut reservoir = Reservoir::new(ReservoirConfig { arrival_samples_per_hour_max: 16, seed: 1, ..ReservoirConfig::default() });
            let mut seen = std::collections::BTreeSet::new();
            let mut hours = std::collections::BTreeSet::new();
            for &(back, hour, offset, template) in &history {
                reservoir.handle_arrival(at(MONDAY - back, hour, offset), TemplateId(template));
                seen.insert(TemplateId(template));
                hours.insert(hour);
            }
            let day = forecast_day(&reservoir, MONDAY, &(MONDAY - 14..MONDAY), ForecastMethod::Window { days: 14 }, seed);
            prop_assert!(day.arrivals.windows(2).all(|w| w[0].0 <= w[1].0));
            let ratios = day_to_day_ratios(&reservoir, &bins(ForecastMethod::Window { days: 14 }, MONDAY, &(MONDAY - 14..MONDAY)));
            prop_assert!(ratios.iter().all(|r| *r >= 0.0), "{:?}", ratios);
            for (offset, template) in &day.arrivals {
                prop_assert!(seen.contains(template));
                let hour = (offset.as_secs_f64() / 3_600.0) as u8;
                prop_assert!(hours.contains(&hour), "hour {} had no history", hour);
            }
        }
    }
}
