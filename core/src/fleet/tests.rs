use super::*;

fn quiet(service_ms: u64, instances: u32) -> FleetConfig {
    FleetConfig { noise_sigma: 0.0, workers_per_instance: 1, ..FleetConfig::spandana(Duration::from_millis(service_ms), instances, 1) }
}

fn policy(dispatch: Dispatch, offload: Offload, scaling: Scaling) -> FleetPolicy {
    FleetPolicy { name: "test".into(), dispatch, offload, scaling }
}

fn at_ms(ms: u64) -> Instant {
    Instant::from_micros(ms * 1_000)
}

#[test]
fn spaced_requests_take_the_idle_service_time() {
    let config = quiet(10, 1);
    let summary = simulate(&config, &policy(Dispatch::RoundRobin, Offload::Never, Scaling::Fixed), (0..100).map(|i| at_ms(i * 50)));
    assert_eq!((summary.requests, summary.violations, summary.offloaded), (100, 0, 0));
    assert!((summary.latency_ms_p99 - 10.0).abs() < 1e-3, "{}", summary.latency_ms_p99);
}

#[test]
fn a_burst_queues_in_arrival_order() {
    // Ten requests at once on one single-worker instance: the k-th waits
    // for the k − 1 before it.
    let config = quiet(10, 1);
    let summary = simulate(&config, &policy(Dispatch::RoundRobin, Offload::Never, Scaling::Fixed), (0..10).map(|_| at_ms(0)));
    assert!((summary.latency_ms_p99 - 100.0).abs() < 1e-3, "{}", summary.latency_ms_p99);
    assert!(summary.utilisation > 0.0 && summary.utilisation <= 1.0 + 1e-9, "{}", summary.utilisation);
}

#[test]
fn the_slo_director_offloads_beyond_its_bounded_queue() {
    let config = quiet(10, 1);
    let summary = simulate(&config, &policy(Dispatch::RoundRobin, Offload::QueueBound { max_waiting: 3, pacing: None }, Scaling::Fixed), (0..10).map(|_| at_ms(0)));
    // One runs, three wait, six go elastic.
    assert_eq!(summary.offloaded, 6);
    assert!(summary.elastic_cost_usd > 0.0);
}

#[test]
fn slogate_offloads_only_what_would_miss_the_slo() {
    // SLO 100 ms: on one instance the 10th of a simultaneous burst would
    // finish at 100 ms (met), the 11th at 110 ms (missed).
    let mut config = quiet(10, 1);
    config.elastic.cold_start = Duration::ZERO;
    let slogate = policy(Dispatch::LeastLoaded, Offload::PredictedSlo { margin: 1.0, budget: None }, Scaling::Fixed);
    let summary = simulate(&config, &slogate, (0..30).map(|_| at_ms(0)));
    assert_eq!((summary.offloaded, summary.violations), (20, 0), "{summary:?}");
    // A tier slower than the SLO takes nothing.
    config.elastic.speed_factor = 0.05;
    let summary = simulate(&config, &slogate, (0..30).map(|_| at_ms(0)));
    assert_eq!((summary.offloaded, summary.violations), (0, 20), "{summary:?}");
}

#[test]
fn the_hpa_adds_instances_under_load_and_the_sro_sizes_for_cost() {
    // 500 rps of 10 ms requests: five single-worker instances at full use.
    let arrivals: Vec<Instant> = (0..300_000u64).map(|i| Instant::from_micros(i * 2_000)).collect();
    let config = quiet(10, 1);
    let hpa = Scaling::Hpa { target: 0.6, interval: Duration::from_secs(15), scale_down_window: Duration::from_secs(300) };
    let summary = simulate(&config, &policy(Dispatch::RoundRobin, Offload::Never, hpa), arrivals.iter().copied());
    // Steady state needs 5 / 0.6 ≈ 9 instances over 600 s.
    assert!(summary.instance_hours > 5.0 * 600.0 / 3_600.0, "{summary:?}");
    let sro = Scaling::Sro { interval: Duration::from_secs(60), window: Duration::from_secs(300), rps_share: 0.9 };
    let summary = simulate(&config, &policy(Dispatch::LeastLoaded, Offload::QueueBound { max_waiting: 5, pacing: None }, sro), arrivals.iter().copied());
    assert!(summary.utilisation > 0.7, "{summary:?}");
}

#[test]
fn a_run_is_a_pure_function_of_its_inputs() {
    let config = FleetConfig::spandana(Duration::from_millis(14), 3, 7);
    let arrivals: Vec<Instant> = (0..20_000u64).map(|i| Instant::from_micros(i * 7_000 % 140_000_000 + i)).collect();
    let mut sorted = arrivals.clone();
    sorted.sort();
    let p = policy(Dispatch::RoundRobin, Offload::QueueBound { max_waiting: 4, pacing: None }, Scaling::Sro { interval: Duration::from_secs(60), window: Duration::from_secs(300), rps_share: 0.9 });
    assert_eq!(simulate(&config, &p, sorted.iter().copied()), simulate(&config, &p, sorted.iter().copied()));
}

#[test]
fn an_adaptive_margin_spends_the_budget_it_is_given() {
    // 1,050 rps of noisy 10 ms requests on five two-worker instances (105%
    // of their capacity): a tight fixed margin offloads more than needed;
    // the adaptive one keeps violations within the budget and offloads
    // less.
    let config = FleetConfig { noise_sigma: 0.3, ..FleetConfig::spandana(Duration::from_millis(10), 5, 3) };
    let arrivals: Vec<Instant> = (0..315_000u64).map(|i| Instant::from_micros(i * 952)).collect();
    let fixed = simulate(&config, &policy(Dispatch::LeastLoaded, Offload::PredictedSlo { margin: 0.3, budget: None }, Scaling::Fixed), arrivals.iter().copied());
    let adaptive = simulate(&config, &policy(Dispatch::LeastLoaded, Offload::PredictedSlo { margin: 0.3, budget: Some(0.01) }, Scaling::Fixed), arrivals.iter().copied());
    assert!(adaptive.violation_rate <= 0.01, "{adaptive:?}");
    assert!(adaptive.offloaded < fixed.offloaded, "{} vs {}", adaptive.offloaded, fixed.offloaded);
}

#[test]
fn the_slo_directors_pacing_forwards_no_faster_than_rps_max() {
    // Two-worker instance, 10 ms requests, paced at 50 rps (one per 20 ms):
    // a burst of four starts at 0, 20, 40 and 60 ms although a worker is
    // free at 0 and 10 ms, so the last finishes at 70 ms.
    let config = FleetConfig { workers_per_instance: 2, ..quiet(10, 1) };
    let paced = Offload::QueueBound { max_waiting: 10, pacing: Some(Pacing::at(50.0)) };
    let summary = simulate(&config, &policy(Dispatch::RoundRobin, paced, Scaling::Fixed), (0..4).map(|_| at_ms(0)));
    assert_eq!(summary.offloaded, 0);
    assert!((summary.latency_ms_p99 - 70.0).abs() < 1e-3, "{summary:?}");
    let unpaced = Offload::QueueBound { max_waiting: 10, pacing: None };
    let summary = simulate(&config, &policy(Dispatch::RoundRobin, unpaced, Scaling::Fixed), (0..4).map(|_| at_ms(0)));
    assert!((summary.latency_ms_p99 - 20.0).abs() < 1e-3, "{summary:?}");
}

#[test]
fn the_slo_director_slows_its_pacing_while_responses_miss_the_slo() {
    // Responses take 10 ms against a 5 ms SLO, so every one the director
    // sees lengthens the interval (up to 4× the base of 10 ms): 100
    // requests spaced 10 ms apart, one worker, end up queueing and
    // overflow the queue, where unpaced they would flow through untouched.
    let mut config = quiet(10, 1);
    config.slo = Duration::from_millis(5);
    let arrivals: Vec<Instant> = (0..100).map(|i| at_ms(i * 10 + 1)).collect();
    let paced = Offload::QueueBound { max_waiting: 3, pacing: Some(Pacing::at(100.0)) };
    let slowed = simulate(&config, &policy(Dispatch::RoundRobin, paced, Scaling::Fixed), arrivals.iter().copied());
    let unpaced = Offload::QueueBound { max_waiting: 3, pacing: None };
    let flowing = simulate(&config, &policy(Dispatch::RoundRobin, unpaced, Scaling::Fixed), arrivals.iter().copied());
    assert_eq!(flowing.offloaded, 0, "{flowing:?}");
    // At 4× the base interval the instance takes one request in four.
    assert!(slowed.offloaded > 50, "{slowed:?}");
}
