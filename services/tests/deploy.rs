//! The deployment files in `deploy/` parse, and name only ports, paths and
//! environment variables the node's configuration knows: the compose file
//! of three nodes and etcd, and the Kubernetes StatefulSet.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize as _;
use serde_yaml::Value;
use slogate::config::{NodeConfig, Overrides};

fn repo(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn str_of(value: &Value) -> &str {
    value.as_str().unwrap_or_else(|| panic!("not a string: {value:?}"))
}

/// The node configuration `toml` as loaded with `environment`.
fn load(toml: &str, environment: &BTreeMap<String, String>) -> NodeConfig {
    let known: Vec<&str> = NodeConfig::ENVIRONMENT_KEYS.to_vec();
    for key in environment.keys() {
        assert!(known.contains(&key.as_str()), "`{key}` is not an environment variable the node reads ({known:?})");
    }
    let env: std::collections::HashMap<String, String> = environment.clone().into_iter().collect();
    NodeConfig::load(toml, &env, &Overrides::default()).unwrap_or_else(|e| panic!("the deployment's node configuration: {e}"))
}

#[test]
fn the_compose_file_runs_three_nodes_on_one_etcd_with_ports_and_paths_the_config_names() {
    let compose: Value = serde_yaml::from_str(&repo("deploy/fleet/compose.yaml")).unwrap();
    let services = compose["services"].as_mapping().unwrap();
    let etcd = &compose["services"]["etcd"];
    let etcd_flags: Vec<&str> = etcd["command"].as_sequence().unwrap().iter().map(str_of).collect();
    assert!(etcd_flags.contains(&"--advertise-client-urls=http://etcd:2379"), "{etcd_flags:?}");
    let toml = repo("deploy/fleet/node.toml");
    let mut ids = Vec::new();
    let mut host_ports = Vec::new();
    for (name, service) in services.iter().filter(|(name, _)| str_of(name) != "etcd") {
        let command: Vec<&str> = service["command"].as_sequence().unwrap().iter().map(str_of).collect();
        assert_eq!(command[..2], ["serve", "--config"], "{name:?}");
        let mounts: Vec<&str> = service["volumes"].as_sequence().unwrap().iter().map(str_of).collect();
        let config_mount = mounts.iter().find(|m| m.contains(command[2])).unwrap_or_else(|| panic!("{name:?} mounts its --config"));
        assert!(config_mount.starts_with("./node.toml:"), "{config_mount}");
        let environment: BTreeMap<String, String> =
            service["environment"].as_mapping().unwrap().iter().map(|(k, v)| (str_of(k).to_owned(), str_of(v).to_owned())).collect();
        let config = load(&toml, &environment);
        let fleet = &config.file.fleet;
        assert_eq!(fleet.node_id, str_of(name));
        assert_eq!(fleet.etcd_endpoints, ["http://etcd:2379"]);
        // Other nodes reach it by its service name on its gRPC port.
        assert_eq!(fleet.advertise_addr, format!("{}:{}", str_of(name), config.grpc_addr.port()));
        let data = config.data_dir.display().to_string();
        assert!(mounts.iter().any(|m| m.ends_with(&format!(":{data}"))), "{name:?} keeps {data} on a volume: {mounts:?}");
        let mut container_ports: Vec<u16> = Vec::new();
        for mapping in service["ports"].as_sequence().unwrap().iter().map(str_of) {
            let (host, container) = mapping.split_once(':').unwrap();
            container_ports.push(container.parse().unwrap());
            host_ports.push(host.to_owned());
        }
        container_ports.sort_unstable();
        let mut expected = vec![config.grpc_addr.port(), config.admin_addr.port()];
        expected.sort_unstable();
        assert_eq!(container_ports, expected, "{name:?} publishes exactly gRPC and the admin API");
        ids.push(fleet.node_id.clone());
    }
    assert_eq!(ids.len(), 3, "three nodes");
    let distinct_hosts: std::collections::BTreeSet<&String> = host_ports.iter().collect();
    assert_eq!(distinct_hosts.len(), host_ports.len(), "no host port published twice");
}

#[test]
fn the_statefulset_gives_each_pod_its_id_address_volume_and_the_config_s_ports() {
    let text = repo("deploy/k8s/slogate.yaml");
    let documents: Vec<Value> = serde_yaml::Deserializer::from_str(&text).map(|d| Value::deserialize(d).unwrap()).collect();
    let kind = |k: &'static str| documents.iter().filter(move |d| d["kind"] == k);
    let config_map = kind("ConfigMap").next().expect("a ConfigMap");
    let toml = str_of(&config_map["data"]["node.toml"]);
    let set = kind("StatefulSet").next().expect("a StatefulSet");
    let headless = kind("Service").find(|s| s["spec"]["clusterIP"] == "None").expect("a headless Service");
    assert_eq!(set["spec"]["serviceName"], headless["metadata"]["name"]);
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"].as_sequence().unwrap().iter().map(str_of).collect();
    assert_eq!(args[..2], ["serve", "--config"]);

    // The environment as a pod sees it, with $(VAR) substituted.
    let pod = "slogate-1";
    let mut environment = BTreeMap::new();
    let mut helpers = BTreeMap::new();
    for var in container["env"].as_sequence().unwrap() {
        let name = str_of(&var["name"]).to_owned();
        let value = match var["value"].as_str() {
            Some(value) => helpers.iter().fold(value.to_owned(), |v, (k, h): (&String, &String)| v.replace(&format!("$({k})"), h)),
            None => {
                assert_eq!(var["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name", "{name}");
                pod.to_owned()
            }
        };
        if name.starts_with("SLOGATE_") {
            environment.insert(name, value);
        } else {
            helpers.insert(name, value);
        }
    }
    let config = load(toml, &environment);
    assert_eq!(config.file.fleet.node_id, pod);
    let headless_name = str_of(&headless["metadata"]["name"]);
    assert_eq!(config.file.fleet.advertise_addr, format!("{pod}.{headless_name}:{}", config.grpc_addr.port()));
    assert!(!config.file.fleet.etcd_endpoints.is_empty());

    // Ports: the container's, the headless Service's and the probes' are the config's.
    let port_named = |ports: &Value, name: &str, key: &str| ports.as_sequence().unwrap().iter().find(|p| p["name"] == name).and_then(|p| p[key].as_u64());
    assert_eq!(port_named(&container["ports"], "grpc", "containerPort"), Some(u64::from(config.grpc_addr.port())));
    assert_eq!(port_named(&container["ports"], "admin", "containerPort"), Some(u64::from(config.admin_addr.port())));
    assert_eq!(port_named(&headless["spec"]["ports"], "grpc", "port"), Some(u64::from(config.grpc_addr.port())));
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"].as_u64(), Some(u64::from(config.admin_addr.port())), "{probe}");
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");

    // The data dir is on the pod's own persistent volume; the config file
    // comes from the ConfigMap.
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    let mount_of = |path: &str| mounts.iter().find(|m| m["mountPath"] == path).map(|m| str_of(&m["name"]).to_owned());
    let data = mount_of(&config.data_dir.display().to_string()).expect("the data dir is mounted");
    let claims = set["spec"]["volumeClaimTemplates"].as_sequence().unwrap();
    assert!(claims.iter().any(|c| c["metadata"]["name"] == data.as_str()), "the data dir's volume is a claim template");
    let config_dir = Path::new(args[2]).parent().unwrap().display().to_string();
    assert!(mount_of(&config_dir).is_some(), "the --config file's directory is mounted");
}
