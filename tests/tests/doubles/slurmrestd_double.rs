//! The slurmrestd double: token checking, Slurm node-state semantics, and
//! response shapes checked against the real v0.0.44 OpenAPI description.

use std::time::Duration;

use mountguard_tests::slurmrestd::{ReturnToService, SlurmrestdDouble, call, mint_token};
use serde_json::{Value, json};

use crate::eventually;

const TOKEN: &str = "static-token";

fn openapi() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/slurm/slurmrestd-openapi-v0.0.44.json"
    );
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("the slurmrestd OpenAPI description at {path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// A focused OpenAPI 3 schema check: `$ref`, `type`, `enum`, `required`,
/// `properties`, `items`; and, stricter than the schema, no property the
/// schema does not name (the double must not invent fields).
fn validate(doc: &Value, schema: &Value, v: &Value, at: &str, errs: &mut Vec<String>) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        let target = &doc["components"]["schemas"][name];
        assert!(!target.is_null(), "unresolved $ref {r}");
        return validate(doc, target, v, at, errs);
    }
    let ok = match schema["type"].as_str() {
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        _ => true,
    };
    if !ok {
        errs.push(format!("{at}: expected {}, got {v}", schema["type"]));
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(v)
    {
        errs.push(format!("{at}: {v} not in enum"));
    }
    for req in schema["required"].as_array().into_iter().flatten() {
        let k = req.as_str().unwrap();
        if v.get(k).is_none() {
            errs.push(format!("{at}: missing required {k}"));
        }
    }
    if let (Some(obj), Some(props)) = (v.as_object(), schema["properties"].as_object()) {
        for (k, val) in obj {
            match props.get(k) {
                Some(p) => validate(doc, p, val, &format!("{at}.{k}"), errs),
                None => errs.push(format!("{at}: unknown property {k}")),
            }
        }
    }
    if let (Some(items), Some(schema_items)) = (v.as_array(), schema.get("items")) {
        for (i, it) in items.iter().enumerate() {
            validate(doc, schema_items, it, &format!("{at}[{i}]"), errs);
        }
    }
}

fn check(doc: &Value, schema_name: &str, v: &Value) {
    let mut errs = Vec::new();
    validate(
        doc,
        &json!({"$ref": format!("#/components/schemas/{schema_name}")}),
        v,
        schema_name,
        &mut errs,
    );
    assert!(errs.is_empty(), "{schema_name}: {errs:#?}");
}

/// Checks `v` against the schema `route`'s `method` declares for a 200
/// response.
fn check_response(doc: &Value, route: &str, method: &str, v: &Value) {
    check(doc, &response_schema(doc, route, method), v);
}

/// GETs `path` with the token, asserts a 200 and checks the answer against
/// the schema of `route`'s GET; the answer.
async fn get_checked(url: &str, doc: &Value, path: &str, route: &str) -> Value {
    let (st, v) = call(url, "GET", path, Some(TOKEN), None).await;
    assert_eq!(st, 200, "GET {path}: {v}");
    check_response(doc, route, "get", &v);
    v
}

/// The schema a path's operation declares for a 200 response.
fn response_schema(doc: &Value, path: &str, method: &str) -> String {
    doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        .as_str()
        .unwrap()
        .trim_start_matches("#/components/schemas/")
        .to_string()
}

#[test]
fn the_schema_check_itself_rejects_wrong_shapes() {
    let doc = openapi();
    let mut errs = Vec::new();
    let bad = json!({"nodes": [{"name": 1, "state": "IDLE"}]});
    validate(
        &doc,
        &json!({"$ref": "#/components/schemas/v0.0.44_openapi_nodes_resp"}),
        &bad,
        "r",
        &mut errs,
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("missing required last_update")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("r.nodes[0].name: expected \"string\"")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("r.nodes[0].state: expected \"array\"")),
        "{errs:?}"
    );
    let mut errs = Vec::new();
    let bad = json!({"state": ["DRAINED"], "reason": "x"});
    validate(
        &doc,
        &json!({"$ref": "#/components/schemas/v0.0.44_update_node_msg"}),
        &bad,
        "m",
        &mut errs,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
}

#[tokio::test]
async fn slurmrestd_double_requires_a_valid_token() {
    let mut d = SlurmrestdDouble::start("slinky").await.unwrap();
    let h = d.handle();
    h.add_token(TOKEN, "slurm");
    h.set_jwt_key(b"jwt-key-bytes");
    let url = d.url();
    // No token: 401, a text/plain body (not JSON).
    let (st, body) = call(&url, "GET", "/slurm/v0.0.44/nodes/", None, None).await;
    assert_eq!(st, 401);
    assert_eq!(body, Value::Null, "{body}");
    // A token slurmrestd cannot verify: 511, error 1007.
    let (st, body) = call(&url, "GET", "/slurm/v0.0.44/nodes/", Some("wrong"), None).await;
    assert_eq!(st, 511);
    assert_eq!(body["errors"][0]["error_number"], 1007);
    assert_eq!(
        call(&url, "GET", "/slurm/v0.0.44/nodes/", Some(TOKEN), None)
            .await
            .0,
        200
    );
    let jwt = mint_token(b"jwt-key-bytes", "slurm", Duration::from_secs(60));
    let (st, body) = call(&url, "GET", "/slurm/v0.0.44/nodes/", Some(&jwt), None).await;
    assert_eq!(st, 200);
    assert_eq!(body["meta"]["client"]["user"], "slurm");
    let forged = mint_token(b"another-key", "slurm", Duration::from_secs(60));
    assert_eq!(
        call(&url, "GET", "/slurm/v0.0.44/nodes/", Some(&forged), None)
            .await
            .0,
        511
    );
    let expired = mint_token(b"jwt-key-bytes", "slurm", Duration::ZERO);
    assert_eq!(
        call(&url, "GET", "/slurm/v0.0.44/nodes/", Some(&expired), None)
            .await
            .0,
        511
    );
    // A rejected write is still recorded.
    let (st, _) = call(
        &url,
        "POST",
        "/slurm/v0.0.44/node/n1",
        None,
        Some(&json!({"state": ["DRAIN"], "reason": "x"})),
    )
    .await;
    assert_eq!(st, 401);
    assert_eq!(h.writes().len(), 1);
    assert_eq!(h.writes()[0].user, None);
    d.shutdown().await;
}

/// A reason without a state stays only on a node that is DOWN, DRAIN or
/// FAIL: Slurm frees the reason of any other node at the end of the update
/// (`update_node` → `clusteracct_storage_g_node_up`).
#[tokio::test]
async fn slurmrestd_double_keeps_a_reason_without_a_state_only_on_a_closed_node() {
    let mut d = SlurmrestdDouble::start("slinky").await.unwrap();
    let h = d.handle();
    h.add_token(TOKEN, "mountguard");
    h.add_admin("mountguard");
    h.set_controller_key(b"key-1");
    h.add_node("slinky-0", 4);
    h.slurmd_started("slinky-0", b"key-1");
    let url = d.url();
    let post = |body: serde_json::Value| {
        let url = url.clone();
        async move {
            call(
                &url,
                "POST",
                "/slurm/v0.0.44/node/slinky-0",
                Some(TOKEN),
                Some(&body),
            )
            .await
            .0
        }
    };
    assert_eq!(post(json!({"reason": "mountguard: first"})).await, 200);
    let v = h.node("slinky-0").unwrap();
    assert_eq!((v.state, v.reason.as_str()), (vec!["IDLE".to_string()], ""));
    assert_eq!(
        post(json!({"state": ["DRAIN"], "reason": "admin: a"})).await,
        200
    );
    assert_eq!(post(json!({"reason": "admin: b"})).await, 200);
    let v = h.node("slinky-0").unwrap();
    assert_eq!(
        (v.state, v.reason.as_str()),
        (vec!["IDLE".to_string(), "DRAIN".to_string()], "admin: b")
    );
    d.shutdown().await;
}

#[tokio::test]
async fn slurmrestd_double_follows_slurm_state_semantics_for_jobs_drain_and_auth_keys() {
    let mut d = SlurmrestdDouble::start("slinky").await.unwrap();
    let h = d.handle();
    h.add_token(TOKEN, "mountguard");
    h.add_admin("mountguard");
    h.set_resume_settle(Duration::ZERO);
    h.set_controller_key(b"key-1");
    h.add_node("slinky-0", 4);
    h.add_node("slinky-1", 4);
    let url = d.url();
    let state = |n: &str| h.node(n).unwrap().state;
    assert_eq!(
        state("slinky-0"),
        ["DOWN", "NOT_RESPONDING"],
        "slurmd not started yet"
    );
    h.slurmd_started("slinky-0", b"key-1");
    h.slurmd_started("slinky-1", b"stale-key");
    assert_eq!(state("slinky-0"), ["IDLE"]);
    // An auth-key mismatch is not DOWN: the node flaps (its own test
    // below), with no reason, and takes no job.
    assert_eq!(state("slinky-1")[0], "IDLE");
    assert_eq!(h.node("slinky-1").unwrap().reason, "");
    assert_eq!(h.start_job_if_open("slinky-1", 1), None);
    h.slurmd_started("slinky-1", b"key-1");
    assert_eq!(state("slinky-1"), ["IDLE"]);

    let j1 = h.start_job("slinky-0", 2);
    assert_eq!(state("slinky-0"), ["MIXED"]);
    let j2 = h.start_job("slinky-0", 2);
    assert_eq!(state("slinky-0"), ["ALLOCATED"]);

    // A drain without a reason is accepted (Slurm 26.05): no reason yet.
    let (st, body) = call(
        &url,
        "POST",
        "/slurm/v0.0.44/node/slinky-0",
        Some(TOKEN),
        Some(&json!({"state": ["DRAIN"]})),
    )
    .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(h.node("slinky-0").unwrap().reason, "");
    let drain = json!({"state": ["DRAIN"], "reason": "mountguard: stale slurm.key"});
    let (st, body) = call(
        &url,
        "POST",
        "/slurm/v0.0.44/node/slinky-0",
        Some(TOKEN),
        Some(&drain),
    )
    .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["errors"], json!([]));
    let v = h.node("slinky-0").unwrap();
    assert_eq!(v.state, ["ALLOCATED", "DRAIN"]);
    assert!(!v.is_drained(), "draining while jobs run");
    assert_eq!(
        (v.reason.as_str(), v.reason_set_by_user.as_str()),
        ("mountguard: stale slurm.key", "mountguard")
    );

    h.set_epilog(Duration::from_secs(2));
    h.end_job(j1);
    assert_eq!(state("slinky-0"), ["ALLOCATED", "DRAIN", "COMPLETING"]);
    h.end_job(j2);
    eventually(10, "epilog done", || {
        let s = state("slinky-0");
        async move { (s == ["IDLE", "DRAIN"]).then_some(()) }
    })
    .await;
    assert!(h.node("slinky-0").unwrap().is_drained());
    assert!(h.killed_jobs().is_empty(), "ended jobs are not killed");

    // slurmd stopping under a running job kills it.
    let j3 = h.start_job("slinky-0", 1);
    h.slurmd_stopped("slinky-0");
    assert_eq!(h.killed_jobs(), vec![j3]);
    assert_eq!(state("slinky-0"), ["DOWN", "DRAIN", "NOT_RESPONDING"]);
    // Slurm appended its own message to the drain's reason, as SlurmUser.
    let v = h.node("slinky-0").unwrap();
    assert_eq!(
        (v.reason.as_str(), v.reason_set_by_user.as_str()),
        ("mountguard: stale slurm.key : Not responding", "slurm")
    );
    h.slurmd_started("slinky-0", b"key-1");
    assert!(
        h.node("slinky-0").unwrap().is_drained(),
        "the killed job is gone"
    );
    // ReturnToService=1 returns only a DOWN whose reason is "Not
    // responding": this one carries the drain's reason, so it stays DOWN.
    assert_eq!(state("slinky-0"), ["DOWN", "DRAIN"]);
    call(
        &url,
        "POST",
        "/slurm/v0.0.44/node/slinky-0",
        Some(TOKEN),
        Some(&json!({"state": ["RESUME"]})),
    )
    .await;
    call(
        &url,
        "POST",
        "/slurm/v0.0.44/node/slinky-0",
        Some(TOKEN),
        Some(&drain),
    )
    .await;

    // GET /node/{name} shows the same through the API.
    let (st, body) = call(
        &url,
        "GET",
        "/slurm/v0.0.44/node/slinky-0",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(body["nodes"][0]["state"], json!(["IDLE", "DRAIN"]));
    assert_eq!(body["nodes"][0]["reason_set_by_user"], "mountguard");

    let (st, _) = call(
        &url,
        "POST",
        "/slurm/v0.0.44/node/slinky-0",
        Some(TOKEN),
        Some(&json!({"state": ["UNDRAIN"]})),
    )
    .await;
    assert_eq!(st, 200);
    let v = h.node("slinky-0").unwrap();
    assert_eq!(
        (v.state.clone(), v.reason.as_str()),
        (vec!["IDLE".to_string()], "")
    );

    // DOWN then RESUME.
    let (st, _) = call(
        &url,
        "POST",
        "/slurm/v0.0.44/node/slinky-1",
        Some(TOKEN),
        Some(&json!({"state": ["DOWN"], "reason": "maint"})),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(state("slinky-1"), ["DOWN"]);
    call(
        &url,
        "POST",
        "/slurm/v0.0.44/node/slinky-1",
        Some(TOKEN),
        Some(&json!({"state": ["RESUME"]})),
    )
    .await;
    assert_eq!(state("slinky-1"), ["IDLE"]);

    // Unknown node: 200, no nodes, error 0.
    let (st, body) = call(&url, "GET", "/slurm/v0.0.44/node/nope", Some(TOKEN), None).await;
    assert_eq!(st, 200);
    assert_eq!(
        body["errors"][0]["description"],
        "Failure to query node nope"
    );
    assert_eq!(body["errors"][0]["error_number"], 0);
    assert!(body.get("nodes").is_none(), "{body}");
    // Writes are recorded in order, GETs are not.
    let writes = h.writes();
    let statuses: Vec<u16> = writes.iter().map(|w| w.status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 200]);
    assert_eq!(writes[1].body, drain);
    d.shutdown().await;
}

#[tokio::test]
async fn slurmrestd_double_returns_down_nodes_to_service_as_return_to_service_says_and_keeps_fail()
{
    let mut d = SlurmrestdDouble::start("slinky").await.unwrap();
    let h = d.handle();
    h.add_token(TOKEN, "mountguard");
    h.add_admin("mountguard");
    h.set_resume_settle(Duration::ZERO);
    h.set_controller_key(b"key-1");
    let url = d.url();
    let post = |node: &'static str, body: Value| {
        let url = url.clone();
        async move {
            call(
                &url,
                "POST",
                &format!("/slurm/v0.0.44/node/{node}"),
                Some(TOKEN),
                Some(&body),
            )
            .await
            .0
        }
    };
    let state = |n: &str| h.node(n).unwrap().state;
    let reason = |n: &str| h.node(n).unwrap().reason;
    for rts in [
        ReturnToService::Never,
        ReturnToService::NotResponding,
        ReturnToService::Always,
    ] {
        h.set_return_to_service(rts);
        // n-nr: DOWN for not responding (reason "Not responding").
        // n-dr: the same, then drained with a reason of its own.
        // n-admin: slurmd answers; set DOWN by a request (the preStop hook).
        for n in ["n-nr", "n-dr", "n-admin"] {
            h.add_node(n, 4);
            h.slurmd_started(n, b"key-1");
            // Open it (left closed by the round before: 200; open: 422).
            let resumed = post(n, json!({"state": ["RESUME"]})).await;
            assert!(resumed == 200 || resumed == 422, "{resumed}");
            h.slurmd_stopped(n);
            assert_eq!(state(n), ["DOWN", "NOT_RESPONDING"], "{rts:?} {n}");
            assert_eq!(reason(n), "Not responding");
        }
        let drain = json!({"state": ["DRAIN"], "reason": "mountguard: x attempt 1"});
        assert_eq!(post("n-dr", drain).await, 200);
        h.slurmd_started("n-admin", b"key-1");
        let down = json!({"state": ["DOWN"], "reason": "slurm-operator: Pod is terminating"});
        assert_eq!(post("n-admin", down).await, 200);
        h.slurmd_stopped("n-admin");
        // Every slurmd registers again with the right key.
        for n in ["n-nr", "n-dr", "n-admin"] {
            h.slurmd_started(n, b"key-1");
        }
        let (nr, dr, admin) = (state("n-nr"), state("n-dr"), state("n-admin"));
        match rts {
            ReturnToService::Never => {
                assert_eq!(nr, ["DOWN"], "{rts:?}");
                assert_eq!(dr, ["DOWN", "DRAIN"], "{rts:?}");
                assert_eq!(admin, ["DOWN"], "{rts:?}");
            }
            ReturnToService::NotResponding => {
                assert_eq!(nr, ["IDLE"], "{rts:?}");
                assert_eq!(reason("n-nr"), "", "the DOWN's reason went with it");
                assert_eq!(
                    dr,
                    ["DOWN", "DRAIN"],
                    "{rts:?}: its reason is not \"Not responding\""
                );
                assert_eq!(admin, ["DOWN"], "{rts:?}");
            }
            ReturnToService::Always => {
                assert_eq!(nr, ["IDLE"], "{rts:?}");
                assert_eq!(dr, ["IDLE", "DRAIN"], "{rts:?}: the flags stay");
                assert_eq!(reason("n-dr"), "mountguard: x attempt 1");
                assert_eq!(admin, ["IDLE"], "{rts:?}: the hook's DOWN is gone");
            }
        }
        // A RESUME opens a node still DOWN; one already open is refused
        // (422, error 2180).
        let want = if rts == ReturnToService::Never {
            200
        } else {
            422
        };
        assert_eq!(post("n-nr", json!({"state": ["RESUME"]})).await, want);
        assert_eq!(state("n-nr"), ["IDLE"], "{rts:?}");
    }
    // FAIL: DRAIN and FAIL replace each other; a DOWN leaves FAIL; an
    // UNDRAIN clears it (Slurm 26.05); a registration under
    // ReturnToService=2 keeps it; RESUME clears it.
    h.set_return_to_service(ReturnToService::NotResponding);
    h.add_node("n-fail", 4);
    h.slurmd_started("n-fail", b"key-1");
    let fail = json!({"state": ["FAIL"], "reason": "mountguard: y attempt 2"});
    assert_eq!(post("n-fail", fail.clone()).await, 200);
    assert_eq!(state("n-fail"), ["IDLE", "FAIL"]);
    let drain = json!({"state": ["DRAIN"], "reason": "mountguard: y attempt 2"});
    assert_eq!(post("n-fail", drain).await, 200);
    assert_eq!(state("n-fail"), ["IDLE", "DRAIN"]);
    assert_eq!(post("n-fail", fail.clone()).await, 200);
    assert_eq!(state("n-fail"), ["IDLE", "FAIL"]);
    let down = json!({"state": ["DOWN"], "reason": "slurm-operator: Pod is terminating"});
    assert_eq!(post("n-fail", down).await, 200);
    assert_eq!(
        post("n-fail", json!({"state": ["UNDRAIN"], "reason": ""})).await,
        200
    );
    assert_eq!(state("n-fail"), ["DOWN"]);
    assert_eq!(post("n-fail", fail.clone()).await, 200);
    assert_eq!(state("n-fail"), ["DOWN", "FAIL"]);
    h.set_return_to_service(ReturnToService::Always);
    h.slurmd_stopped("n-fail");
    h.slurmd_started("n-fail", b"key-1");
    assert_eq!(state("n-fail"), ["IDLE", "FAIL"], "returned, still FAIL");
    // The scheduler starts nothing on a FAIL, DRAIN or DOWN node.
    assert_eq!(h.start_job_if_open("n-fail", 1), None);
    assert_eq!(post("n-fail", json!({"state": ["RESUME"]})).await, 200);
    assert_eq!(state("n-fail"), ["IDLE"]);
    let j = h.start_job_if_open("n-fail", 4).expect("open");
    assert_eq!(h.start_job_if_open("n-fail", 1), None, "no CPU left");
    let drain = json!({"state": ["DRAIN"], "reason": "r"});
    h.end_job(j);
    assert_eq!(post("n-fail", drain).await, 200);
    assert_eq!(h.start_job_if_open("n-fail", 1), None);
    let started = h.jobs_started();
    assert_eq!(started.len(), 1);
    let last_write = h.writes().last().unwrap().seq;
    assert!(started[0].0 < last_write, "ordered with the writes");
    d.shutdown().await;
}

#[tokio::test]
async fn slurmrestd_double_responses_and_requests_match_the_v0_0_44_openapi_schema() {
    let doc = openapi();
    let mut d = SlurmrestdDouble::start("slinky").await.unwrap();
    let h = d.handle();
    h.add_token(TOKEN, "slurm");
    h.set_controller_key(b"k");
    for n in ["slinky-0", "slinky-1", "slinky-2"] {
        h.add_node(n, 8);
    }
    h.slurmd_started("slinky-0", b"k");
    h.slurmd_started("slinky-1", b"other");
    h.start_job("slinky-0", 3);
    h.admin_drain("slinky-0", "admin says so", "root");
    let url = d.url();

    let nodes = get_checked(&url, &doc, "/slurm/v0.0.44/nodes/", "/slurm/v0.0.44/nodes/").await;
    assert_eq!(nodes["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(nodes["nodes"][0]["state"], json!(["MIXED", "DRAIN"]));
    let (_, one) = call(
        &url,
        "GET",
        "/slurm/v0.0.44/node/slinky-1",
        Some(TOKEN),
        None,
    )
    .await;
    check_response(&doc, "/slurm/v0.0.44/node/{node_name}", "get", &one);
    // Every node state value is one of the schema's enum values.
    let node_state_enum =
        &doc["components"]["schemas"]["v0.0.44_node"]["properties"]["state"]["items"]["enum"];
    for n in nodes["nodes"].as_array().unwrap() {
        for s in n["state"].as_array().unwrap() {
            assert!(node_state_enum.as_array().unwrap().contains(s), "{s}");
        }
    }
    for body in [
        json!({"state": ["DRAIN"], "reason": "slurm-operator: cordon"}),
        json!({"state": ["UNDRAIN"]}),
        json!({"state": ["DOWN"], "reason": "slurm-operator: Pod is terminating"}),
        json!({"state": ["RESUME"]}),
    ] {
        // The requests a client sends are valid update_node_msg documents.
        let req_schema = doc["paths"]["/slurm/v0.0.44/node/{node_name}"]["post"]["requestBody"]["content"]["application/json"]["schema"].clone();
        let mut errs = Vec::new();
        validate(&doc, &req_schema, &body, "request", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        let (st, resp) = call(
            &url,
            "POST",
            "/slurm/v0.0.44/node/slinky-2",
            Some(TOKEN),
            Some(&body),
        )
        .await;
        assert_eq!(st, 200);
        check_response(&doc, "/slurm/v0.0.44/node/{node_name}", "post", &resp);
    }
    // Error envelopes follow the schema too (a refused token's 511; a
    // missing token's 401 is text/plain).
    let (st, unauth) = call(&url, "GET", "/slurm/v0.0.44/nodes/", Some("forged"), None).await;
    assert_eq!(st, 511);
    check(&doc, "v0.0.44_openapi_resp", &unauth);
    d.shutdown().await;
}

/// What the real Slinky operator reads besides the nodes (its NodeSet
/// controller lists jobs and reservations) and the node comment it writes:
/// the shapes follow the v0.0.44 description; a job is RUNNING on its node
/// while it runs and COMPLETING in its epilog; no reservation exists; the
/// comment is kept and served back; a path the double has no route for is
/// answered 404 and recorded.
#[tokio::test]
async fn slurmrestd_double_serves_jobs_reservations_and_the_node_comment_the_operator_uses() {
    let doc = openapi();
    let mut d = SlurmrestdDouble::start("slinky").await.unwrap();
    let h = d.handle();
    h.add_token(TOKEN, "slurm");
    h.set_controller_key(b"k");
    h.add_node("slinky-0", 8);
    h.slurmd_started("slinky-0", b"k");
    h.set_epilog(Duration::from_secs(60));
    let running = h.start_job("slinky-0", 2);
    let ending = h.start_job("slinky-0", 1);
    h.end_job(ending);
    let url = d.url();

    let jobs = get_checked(&url, &doc, "/slurm/v0.0.44/jobs/", "/slurm/v0.0.44/jobs/").await;
    let list = jobs["jobs"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{jobs:#}");
    let by_id = |id: u32| list.iter().find(|j| j["job_id"] == id).unwrap();
    assert_eq!(by_id(running)["job_state"], json!(["RUNNING"]));
    assert_eq!(by_id(ending)["job_state"], json!(["COMPLETING"]));
    assert_eq!(by_id(running)["nodes"], "slinky-0");
    assert_eq!(by_id(running)["start_time"]["set"], true);

    let res = get_checked(
        &url,
        &doc,
        "/slurm/v0.0.44/reservations/",
        "/slurm/v0.0.44/reservations/",
    )
    .await;
    assert_eq!(res["reservations"], json!([]));
    let one = get_checked(
        &url,
        &doc,
        "/slurm/v0.0.44/reservation/SlurmOperatorMaint-x",
        "/slurm/v0.0.44/reservation/{reservation_name}",
    )
    .await;
    assert_eq!(one["reservations"], json!([]));

    let (_, before) = call(
        &url,
        "GET",
        "/slurm/v0.0.44/node/slinky-0",
        Some(TOKEN),
        None,
    )
    .await;
    let comment = json!({"comment": "{\"podName\":\"slinky-0\"}"});
    let (st, _) = call(
        &url,
        "POST",
        "/slurm/v0.0.44/node/slinky-0",
        Some(TOKEN),
        Some(&comment),
    )
    .await;
    assert_eq!(st, 200);
    let (_, node) = call(
        &url,
        "GET",
        "/slurm/v0.0.44/node/slinky-0",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(node["nodes"][0]["comment"], "{\"podName\":\"slinky-0\"}");
    // A comment changes no state.
    assert_eq!(node["nodes"][0]["state"], before["nodes"][0]["state"]);
    assert_eq!(before["nodes"][0]["comment"], "");

    assert!(h.unserved().is_empty(), "{:?}", h.unserved());
    let (st, _) = call(&url, "GET", "/slurm/v0.0.44/partitions/", Some(TOKEN), None).await;
    assert_eq!(st, 404);
    assert_eq!(
        h.unserved(),
        vec!["GET /slurm/v0.0.44/partitions/".to_string()]
    );
    d.shutdown().await;
}

/// What Slurm 26.05 showed when run here (docs/testing.md, "Slurm"), held
/// by the double: a running slurmd on a stale key is never DOWN and flaps
/// with an empty reason; only an authenticated registration moves
/// `slurmd_start_time`; a stopped slurmd's node goes DOWN only after
/// `SlurmdTimeout`, and Slurm appends its reason to a drain's;
/// `ReturnToService=1` returns a stale slurmd's "Not responding" node;
/// UNDRAIN and RESUME pass through NOT_RESPONDING; and its error shapes.
#[tokio::test]
async fn slurmrestd_double_shows_what_slurm_26_05_showed_for_stale_keys_timeouts_and_errors() {
    let mut d = SlurmrestdDouble::start("slinky").await.unwrap();
    let h = d.handle();
    h.add_token(TOKEN, "slurm");
    h.add_token("user-token", "alice");
    h.set_controller_key(b"key-new");
    h.set_ping_interval(Duration::from_millis(100));
    let url = d.url();
    let get = |node: &str| {
        let url = url.clone();
        let path = format!("/slurm/v0.0.44/node/{node}");
        async move { call(&url, "GET", &path, Some(TOKEN), None).await }
    };
    let post = |node: &str, token: &str, body: Value| {
        let url = url.clone();
        let path = format!("/slurm/v0.0.44/node/{node}");
        let token = token.to_string();
        async move { call(&url, "POST", &path, Some(&token), Some(&body)).await }
    };

    // A stale running slurmd: IDLE and IDLE+NOT_RESPONDING, never DOWN, no
    // reason, no registration.
    h.add_node("stale", 4);
    h.slurmd_started("stale", b"key-old");
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..12 {
        let (st, body) = get("stale").await;
        assert_eq!(st, 200);
        let n = &body["nodes"][0];
        seen.insert(n["state"].to_string());
        assert_eq!(n["reason"], "");
        assert_eq!(n["slurmd_start_time"]["set"], false, "{n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        seen,
        [
            r#"["IDLE","NOT_RESPONDING"]"#.to_string(),
            r#"["IDLE"]"#.to_string()
        ]
        .into(),
        "it flaps"
    );
    // On the current key it registers: slurmd_start_time set.
    h.slurmd_started("stale", b"key-new");
    let (_, body) = get("stale").await;
    assert_eq!(body["nodes"][0]["state"], json!(["IDLE"]));
    assert_eq!(body["nodes"][0]["slurmd_start_time"]["set"], true);

    // A stopped slurmd: NOT_RESPONDING, DOWN only after SlurmdTimeout, and
    // Slurm's reason appended to the drain's, as SlurmUser.
    h.set_slurmd_timeout(Duration::from_secs(2));
    h.add_node("gone", 4);
    h.slurmd_started("gone", b"key-new");
    let drain = json!({"state": ["DRAIN"], "reason": "mountguard: x attempt a1"});
    assert_eq!(post("gone", TOKEN, drain).await.0, 200);
    h.slurmd_stopped("gone");
    assert_eq!(
        h.node("gone").unwrap().state,
        ["IDLE", "DRAIN", "NOT_RESPONDING"]
    );
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let v = h.node("gone").unwrap();
    assert_eq!(v.state, ["DOWN", "DRAIN", "NOT_RESPONDING"]);
    assert_eq!(v.reason, "mountguard: x attempt a1 : Not responding");
    assert_eq!(v.reason_set_by_user, "slurm");
    // Registered again: DOWN+DRAIN stays until a RESUME (the reason is not
    // exactly "Not responding"), which passes through NOT_RESPONDING.
    h.slurmd_started("gone", b"key-new");
    assert_eq!(h.node("gone").unwrap().state, ["DOWN", "DRAIN"]);
    h.set_resume_settle(Duration::from_secs(5));
    assert_eq!(
        post("gone", TOKEN, json!({"state": ["RESUME"]})).await.0,
        200
    );
    assert_eq!(h.node("gone").unwrap().state, ["IDLE", "NOT_RESPONDING"]);
    eventually(15, "out of NOT_RESPONDING after the resume", || {
        let s = h.node("gone").unwrap().state;
        async move { (s == ["IDLE"]).then_some(()) }
    })
    .await;
    // RESUME of an open node: 422, error 2180.
    let (st, body) = post("gone", TOKEN, json!({"state": ["RESUME"]})).await;
    assert_eq!(
        (st, body["errors"][0]["error_number"].clone()),
        (422, json!(2180))
    );

    // ReturnToService=1 returns a "Not responding" node whose slurmd
    // answers on a stale key.
    h.set_slurmd_timeout(Duration::ZERO);
    h.add_node("rts", 4);
    h.slurmd_stopped("rts");
    assert_eq!(h.node("rts").unwrap().state, ["DOWN", "NOT_RESPONDING"]);
    h.slurmd_started("rts", b"key-old");
    assert_eq!(h.node("rts").unwrap().state[0], "IDLE");
    assert_eq!(h.start_job_if_open("rts", 1), None, "no job on a stale key");

    // Error shapes.
    let (st, body) = post("nope", TOKEN, json!({"state": ["DRAIN"], "reason": "r"})).await;
    assert_eq!(
        (st, body["errors"][0]["error_number"].clone()),
        (422, json!(2018))
    );
    let (st, _) = get("stale").await;
    assert_eq!(st, 200);
    let (st, body) = call(
        &url,
        "GET",
        "/slurm/v0.0.44/node/stale",
        Some("user-token"),
        None,
    )
    .await;
    assert_eq!(st, 200, "a non-admin may read: {body}");
    let (st, body) = post(
        "stale",
        "user-token",
        json!({"state": ["DRAIN"], "reason": "r"}),
    )
    .await;
    assert_eq!(
        (st, body["errors"][0]["error_number"].clone()),
        (422, json!(2010))
    );
    assert_eq!(h.node("stale").unwrap().state, ["IDLE"], "refused");
    let (st, _) = post(
        "stale",
        TOKEN,
        json!({"state": "DRAIN", "reason": "one string"}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(h.node("stale").unwrap().state, ["IDLE", "DRAIN"]);
    let (st, body) = post("stale", TOKEN, json!({"state": ["SLEEPY"]})).await;
    let numbers: Vec<Value> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["error_number"].clone())
        .collect();
    assert_eq!((st, numbers), (500, vec![json!(9207), json!(2180)]));
    // Nothing new since update_time: 304.
    let (_, body) = call(&url, "GET", "/slurm/v0.0.44/nodes/", Some(TOKEN), None).await;
    let t = body["last_update"]["number"].as_i64().unwrap();
    let (st, _) = call(
        &url,
        "GET",
        &format!("/slurm/v0.0.44/nodes/?update_time={t}"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(st, 304);
    d.shutdown().await;
}
