//! One request script, run against the slurmrestd double and against real
//! Slurm 26.05 (slurmctld, slurmd, slurmrestd on loopback), compared step by
//! step on what mountguard reads: HTTP status, error numbers, node states,
//! reason, the reason's user, and whether `slurmd_start_time` moved. The
//! double stays for the in-box rig and the demo; this test holds it to Slurm.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use mountguard_tests::real::slurm::{
    API, RealSlurm, SLURM_USER, SlurmConfig, error_numbers, node_states, random_key,
};
use mountguard_tests::slurmrestd::{ReturnToService, SlurmHandle, SlurmrestdDouble, mint_token};
use serde_json::{Value, json};

/// SlurmdTimeout of both sides: pings every `TIMEOUT / 3`
/// (`_slurmctld_background` in `src/slurmctld/controller.c`).
pub const TIMEOUT: Duration = Duration::from_secs(6);

/// What the script does to a side besides HTTP.
pub trait Side {
    /// slurmrestd's base URL.
    fn url(&self) -> String;
    /// The key slurmctld verifies tokens with.
    fn jwt_key(&self) -> Vec<u8>;
    /// slurmctld now runs on `key` (the rotation).
    async fn controller_key(&self, key: &[u8]);
    /// `node`'s slurmd (re)started on `key`.
    fn slurmd_started(&self, node: &str, key: &[u8]);
    /// `node`'s slurmd stopped.
    fn slurmd_stopped(&self, node: &str);
}

impl Side for (SlurmHandle, String) {
    fn url(&self) -> String {
        self.1.clone()
    }
    fn jwt_key(&self) -> Vec<u8> {
        JWT_KEY.to_vec()
    }
    async fn controller_key(&self, key: &[u8]) {
        self.0.set_controller_key(key);
    }
    fn slurmd_started(&self, node: &str, key: &[u8]) {
        self.0.slurmd_started(node, key);
    }
    fn slurmd_stopped(&self, node: &str) {
        self.0.slurmd_stopped(node);
    }
}

impl Side for RealSlurm {
    fn url(&self) -> String {
        RealSlurm::url(self)
    }
    fn jwt_key(&self) -> Vec<u8> {
        RealSlurm::jwt_key(self).to_vec()
    }
    async fn controller_key(&self, key: &[u8]) {
        self.restart_ctld_with_key(key)
            .await
            .expect("slurmctld restarted on the new key");
    }
    fn slurmd_started(&self, node: &str, key: &[u8]) {
        let digest = mountguard_tests::slurmrestd::key_digest(key);
        let file = self
            .key_file(&format!("{node}-{}", &digest[..12]), key)
            .expect("a key file");
        self.start_slurmd(node, &file).expect("slurmd started");
    }
    fn slurmd_stopped(&self, node: &str) {
        self.stop_slurmd(node);
    }
}

const JWT_KEY: &[u8] = b"contract-jwt-key-of-the-double-0123456789";

/// The double set up as the real rig is: nodes `node-0`, `node-1` on the
/// cluster key `key`, SlurmdTimeout and ping interval as the real one's,
/// ReturnToService 1.
pub async fn double(key: &[u8]) -> (SlurmrestdDouble, (SlurmHandle, String)) {
    let d = SlurmrestdDouble::start("mountguard").await.unwrap();
    let h = d.handle();
    h.set_jwt_key(JWT_KEY);
    h.set_controller_key(key);
    h.set_slurmd_timeout(TIMEOUT);
    h.set_ping_interval(TIMEOUT / 3);
    h.set_resume_settle(Duration::from_secs(1));
    h.set_return_to_service(ReturnToService::NotResponding);
    for n in ["node-0", "node-1"] {
        h.add_node(n, 1);
        h.slurmd_started(n, key);
    }
    let url = d.url();
    (d, (h, url))
}

async fn call(
    side: &impl Side,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    mountguard_tests::real::slurm::call(&side.url(), method, path, token, body).await
}

fn node_path(n: &str) -> String {
    format!("/slurm/{API}/node/{n}")
}

/// `POST node/{node}` with `body` as the token's user.
async fn post(side: &impl Side, token: &str, node: &str, body: Value) -> (u16, Value) {
    call(side, "POST", &node_path(node), Some(token), Some(&body)).await
}

/// `GET node/{node}`.
async fn get(side: &impl Side, token: &str, node: &str) -> (u16, Value) {
    call(side, "GET", &node_path(node), Some(token), None).await
}

/// What mountguard reads of one node.
fn view(v: &Value) -> String {
    let mut states = node_states(v);
    states.sort();
    format!(
        "states={states:?} reason={:?} user={:?}",
        v["nodes"][0]["reason"].as_str().unwrap_or(""),
        v["nodes"][0]["reason_set_by_user"].as_str().unwrap_or("")
    )
}

fn start_time(v: &Value) -> Option<i64> {
    let t = &v["nodes"][0]["slurmd_start_time"];
    (t["set"] == true).then(|| t["number"].as_i64()).flatten()
}

/// Reads `node` until it is out of NOT_RESPONDING (at most `limit`); its
/// view then.
async fn settled(side: &impl Side, token: &str, node: &str, limit: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let (_, v) = call(side, "GET", &node_path(node), Some(token), None).await;
        let nr = node_states(&v).iter().any(|s| s == "NOT_RESPONDING");
        if !nr || tokio::time::Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads `node` every 250 ms for `window`; the set of the states seen
/// and of the reasons seen.
async fn watch(
    side: &impl Side,
    token: &str,
    node: &str,
    window: Duration,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let deadline = tokio::time::Instant::now() + window;
    let (mut states, mut reasons) = (BTreeSet::new(), BTreeSet::new());
    while tokio::time::Instant::now() < deadline {
        let (_, v) = call(side, "GET", &node_path(node), Some(token), None).await;
        states.extend(node_states(&v));
        reasons.insert(v["nodes"][0]["reason"].as_str().unwrap_or("").to_string());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (states, reasons)
}

/// The script. Both nodes start registered on `key`; returns one line per
/// step of what mountguard reads.
pub async fn script(side: &impl Side, key: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let jwt = side.jwt_key();
    let admin = mint_token(&jwt, SLURM_USER, Duration::from_secs(600));
    let admin = admin.as_str();
    let mut step = |name: &str, line: String| out.push(format!("{name}: {line}"));
    let answer = |(code, v): &(u16, Value)| {
        format!(
            "HTTP {code} errors={:?} has_nodes={}",
            error_numbers(v),
            !v["nodes"].is_null()
        )
    };

    // Errors and authentication.
    let r = get(side, admin, "node-9").await;
    step("read of an unknown node", answer(&r));
    let drain = json!({"state": ["DRAIN"], "reason": "mountguard: contract"});
    let r = call(
        side,
        "POST",
        &node_path("node-9"),
        Some(admin),
        Some(&drain),
    )
    .await;
    step("write to an unknown node", answer(&r));
    let r = call(side, "GET", &format!("/slurm/{API}/nodes/"), None, None).await;
    step("no token", format!("HTTP {} json={}", r.0, !r.1.is_null()));
    let forged = mint_token(
        b"some-other-key-entirely-0123456789",
        SLURM_USER,
        Duration::from_secs(600),
    );
    let r = call(
        side,
        "GET",
        &format!("/slurm/{API}/nodes/"),
        Some(&forged),
        None,
    )
    .await;
    step("token signed with another key", answer(&r));
    let expired = {
        // exp in the past: a token minted with a zero lifetime, read two
        // seconds later.
        let t = mint_token(&jwt, SLURM_USER, Duration::ZERO);
        tokio::time::sleep(Duration::from_secs(2)).await;
        t
    };
    let r = call(
        side,
        "GET",
        &format!("/slurm/{API}/nodes/"),
        Some(&expired),
        None,
    )
    .await;
    step("expired token", answer(&r));
    let user = mint_token(&jwt, "nobody", Duration::from_secs(600));
    let r = call(side, "GET", &node_path("node-0"), Some(&user), None).await;
    step(
        "read by a user who is not an administrator",
        format!("HTTP {} {}", r.0, view(&r.1)),
    );
    let r = call(
        side,
        "POST",
        &node_path("node-0"),
        Some(&user),
        Some(&drain),
    )
    .await;
    step("write by a user who is not an administrator", answer(&r));

    // Drain, undrain, resume.
    let r = call(
        side,
        "POST",
        &node_path("node-0"),
        Some(admin),
        Some(&drain),
    )
    .await;
    step("drain", answer(&r));
    let r = get(side, admin, "node-0").await;
    step("drained", view(&r.1));
    let r = post(side, admin, "node-0", json!({"state": "UNDRAIN"})).await;
    step("undrain with the state as one string", answer(&r));
    let v = settled(side, admin, "node-0", Duration::from_secs(10)).await;
    step("undrained, settled", view(&v));
    let r = post(side, admin, "node-0", json!({"state": ["RESUME"]})).await;
    step("resume of an open node", answer(&r));
    let r = post(side, admin, "node-0", json!({"state": ["NO_SUCH_STATE"]})).await;
    step("an unknown state", answer(&r));
    let r = post(side, admin, "node-1", json!({"state": ["DRAIN"]})).await;
    step("drain without a reason", answer(&r));
    let r = get(side, admin, "node-1").await;
    step("drained without a reason", view(&r.1));
    let r = post(side, admin, "node-1", json!({"state": ["RESUME"]})).await;
    step("resume of a drained node", answer(&r));
    let v = settled(side, admin, "node-1", Duration::from_secs(10)).await;
    step("resumed, settled", view(&v));
    let later = mountguard_tests::util::unix_now() + 3600;
    let r = call(
        side,
        "GET",
        &format!("/slurm/{API}/nodes/?update_time={later}"),
        Some(admin),
        None,
    )
    .await;
    step("nodes unchanged since a time", format!("HTTP {}", r.0));

    // A drained node whose slurmd stops: Slurm's own DOWN rewrites the reason.
    let reason = "mountguard: replacing slurmd";
    let r = post(
        side,
        admin,
        "node-0",
        json!({"state": ["DRAIN"], "reason": reason}),
    )
    .await;
    step("drain before the replacement", answer(&r));
    let (_, before) = get(side, admin, "node-0").await;
    side.slurmd_stopped("node-0");
    let (states, reasons) = watch(side, admin, "node-0", TIMEOUT * 3).await;
    step(
        "slurmd stopped past SlurmdTimeout",
        format!("seen={states:?} reasons={reasons:?}"),
    );
    let (_, down) = get(side, admin, "node-0").await;
    step("down for not responding", view(&down));
    side.slurmd_started("node-0", key);
    tokio::time::sleep(TIMEOUT).await;
    let after = settled(side, admin, "node-0", TIMEOUT * 2).await;
    step("slurmd back on the current key", view(&after));
    step(
        "its registration moved slurmd_start_time",
        format!("{}", start_time(&after) > start_time(&before)),
    );
    let r = post(side, admin, "node-0", json!({"state": ["RESUME"]})).await;
    step("resume of the DOWN+DRAIN node", answer(&r));
    let v = settled(side, admin, "node-0", Duration::from_secs(10)).await;
    step("in service", view(&v));

    // The rotation: slurmctld on a new key; node-0's slurmd restarted on
    // it, node-1's still running on the old one.
    let new_key = random_key(64);
    let (_, n1_before) = get(side, admin, "node-1").await;
    side.controller_key(&new_key).await;
    side.slurmd_started("node-0", &new_key);
    let (states, reasons) = watch(side, admin, "node-1", TIMEOUT * 4).await;
    step(
        "a slurmd on the old key, over four SlurmdTimeouts",
        format!("seen={states:?} reasons={reasons:?}"),
    );
    let (_, n1) = get(side, admin, "node-1").await;
    let shown = match start_time(&n1) {
        None => "not set".to_string(),
        Some(0) => "0".to_string(),
        Some(t) if t == start_time(&n1_before).unwrap_or(-1) => "the old slurmd's".to_string(),
        Some(_) => "another".to_string(),
    };
    step(
        "the stale slurmd's slurmd_start_time after the rotation",
        shown,
    );
    let n0 = settled(side, admin, "node-0", TIMEOUT * 2).await;
    step("the slurmd on the new key", view(&n0));

    // slurmctld restarted once more, and node-1's slurmd stopped before it
    // ever answered the restarted slurmctld: never DOWN.
    side.controller_key(&random_key(64)).await;
    side.slurmd_stopped("node-1");
    let (states, reasons) = watch(side, admin, "node-1", TIMEOUT * 3).await;
    step(
        "a slurmd stopped before it answered a restarted slurmctld, over three SlurmdTimeouts",
        format!("seen={states:?} reasons={reasons:?}"),
    );
    out
}

/// Runs the script on both and fails on the first difference, printing
/// both transcripts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_slurm_and_the_slurmrestd_double_answer_one_script_alike() {
    let Some(prefix) = mountguard_tests::real::slurm::prefix_or_skip(
        "real_slurm_and_the_slurmrestd_double_answer_one_script_alike",
    ) else {
        return;
    };
    let real = RealSlurm::start(&prefix, SlurmConfig::nodes(2))
        .await
        .unwrap();
    let key = real.cluster_key();
    let (_d, double_side) = double(&key).await;
    let (want, got) = tokio::join!(script(&real, &key), script(&double_side, &key));
    let mut diff = String::new();
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        let mark = if w == g { "  " } else { "!!" };
        let _ = writeln!(diff, "{mark} {i:2} real:   {w}\n{mark} {i:2} double: {g}");
    }
    assert!(
        want == got,
        "the double answers differently from Slurm {}:\n{diff}\n{}",
        mountguard_tests::real::slurm::SLURM_TAG,
        real.logs(20)
    );
}
