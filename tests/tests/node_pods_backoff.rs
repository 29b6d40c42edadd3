//! Component tests of restart and pull backoffs with paused time: a
//! crashing container restarts at once, then after 10 s, 20 s, 40 s, ...
//! (CrashLoopBackOff, kubelet's message); a missing image is retried after
//! 10 s, 20 s, ... (ErrImagePull → ImagePullBackOff) and starts once it
//! can be pulled.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod node_pods_support;

use std::time::Duration;

use keelson_cri::fake::ExitScript;
use keelson_tests::support::wait_for;
use node_pods_support::*;
use serde_json::json;

fn secs(nanos: i64) -> f64 {
    nanos as f64 / 1e9
}

#[tokio::test(start_paused = true)]
async fn crash_loop_back_off_doubles_the_restart_delay() {
    let w = World::with(Options {
        paused: true,
        ..Default::default()
    })
    .await;
    w.fake
        .script_exit("app", ExitScript::code(1, Duration::from_secs(1)));
    let pod = w
        .create_pod(
            "crash",
            json!({"terminationGracePeriodSeconds": 5, "containers": [{"name": "app", "image": IMAGE}]}),
        )
        .await;
    let uid = pod.metadata.uid.clone().unwrap();
    // Five instances: the first run and four restarts.
    let instances = wait_for(
        "five container instances",
        Duration::from_secs(400),
        Duration::from_millis(200),
        || async {
            let mut cs: Vec<_> = w
                .fake
                .containers()
                .into_iter()
                .filter(|c| c.labels.get("io.kubernetes.pod.uid") == Some(&uid))
                .collect();
            cs.sort_by_key(|c| c.created_at);
            if cs.len() >= 5 && cs[4].started_at > 0 {
                Ok(cs)
            } else {
                Err(format!("{} instances", cs.len()))
            }
        },
    )
    .await
    .unwrap();
    let gaps: Vec<f64> = instances
        .windows(2)
        .map(|p| secs(p[1].started_at) - secs(p[0].finished_at))
        .collect();
    let expected = [0.0, 10.0, 20.0, 40.0];
    for (g, e) in gaps.iter().zip(expected) {
        assert!(
            *g >= e && *g < e + 1.5,
            "restart gaps {gaps:?}, expected about {expected:?}"
        );
    }
    for (i, c) in instances.iter().enumerate() {
        assert_eq!(
            c.annotations["io.kubernetes.container.restartCount"],
            i.to_string()
        );
    }
    // While backing off, the container waits with kubelet's reason and message.
    let p = w
        .wait_pod("crash", "CrashLoopBackOff", Duration::from_secs(120), |p| {
            let s = container_status(p, "app").ok_or("no status")?;
            let waiting = s.state.as_ref().and_then(|st| st.waiting.clone());
            match waiting {
                Some(wt) if wt.reason.as_deref() == Some("CrashLoopBackOff") => Ok((p.clone(), wt)),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    let (p, waiting) = p;
    let msg = waiting.message.unwrap();
    assert!(
        msg.starts_with("back-off ")
            && msg.ends_with(&format!(
                "restarting failed container=app pod=crash_default({uid})"
            )),
        "{msg}"
    );
    let app = container_status(&p, "app").unwrap();
    assert!(app.restart_count >= 4);
    let last = app
        .last_state
        .clone()
        .unwrap()
        .terminated
        .expect("lastState terminated");
    assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
    // Running with restarts: the phase stays Running.
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Running"));
    w.wait_event(
        "crash",
        "BackOff",
        "Back-off restarting failed container app in pod crash_default",
        Duration::from_secs(30),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn image_pull_back_off_then_success() {
    let w = World::with(Options {
        paused: true,
        ..Default::default()
    })
    .await;
    let image = "registry.example/team/app:2";
    w.create_pod(
        "pull",
        json!({"terminationGracePeriodSeconds": 5, "containers": [{"name": "app", "image": image}]}),
    )
    .await;
    // The first pull fails (ErrImagePull); syncs within the next 10 s see
    // the backoff (ImagePullBackOff).
    w.wait_event(
        "pull",
        "Failed",
        "Error: ErrImagePull",
        Duration::from_secs(30),
    )
    .await;
    let evs = w.events("pull").await;
    let failed = evs
        .iter()
        .find(|(r, m, _)| r == "Failed" && m.starts_with("Failed to pull image"))
        .expect("Failed to pull event");
    assert!(
        failed.1.starts_with(&format!(
            "Failed to pull image \"{image}\": rpc error: code = NotFound desc = failed to pull and unpack image"
        )),
        "{}",
        failed.1
    );
    assert_eq!(w.fake.calls_to("PullImage").len(), 1);
    // Within the first 10 s: ImagePullBackOff, no new pull.
    w.wait_pod(
        "pull",
        "ImagePullBackOff",
        Duration::from_secs(9),
        |p| match waiting_reason(p, "app").as_deref() {
            Some("ImagePullBackOff") => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    assert_eq!(w.fake.calls_to("PullImage").len(), 1);
    // The second attempt comes after 10 s, the third after 20 s more.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(w.fake.calls_to("PullImage").len(), 2);
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        w.fake.calls_to("PullImage").len(),
        2,
        "third pull before 20 s"
    );
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(w.fake.calls_to("PullImage").len(), 3);
    w.wait_event(
        "pull",
        "BackOff",
        &format!("Back-off pulling image \"{image}\""),
        Duration::from_secs(5),
    )
    .await;
    w.wait_event(
        "pull",
        "Failed",
        "Error: ImagePullBackOff",
        Duration::from_secs(5),
    )
    .await;
    // Once the registry has it, the next attempt pulls and starts it.
    w.fake.add_registry_image(image, None);
    let p = w
        .wait_phase("pull", "Running", Duration::from_secs(60))
        .await;
    assert!(container_status(&p, "app").unwrap().ready);
    assert_eq!(w.fake.calls_to("PullImage").len(), 4);
}
