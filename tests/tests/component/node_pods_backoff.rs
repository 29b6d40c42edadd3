//! Component tests of restart and pull backoffs with paused time: a
//! crashing container restarts at once, then after 10 s, 20 s, 40 s, ...
//! (up to half again, kubelet's jitter; CrashLoopBackOff, kubelet's
//! message, shown as kubelet shows it: `terminated` through the back-off,
//! `waiting`/`CrashLoopBackOff` at its end just before the restart); a missing image is retried after
//! 10 s, 20 s, ... (ErrImagePull → ImagePullBackOff) and starts once it
//! can be pulled.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::node_pods_support::*;
use keelson_cri::fake::ExitScript;
use keelson_tests::support::wait_for;
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
    // kubelet v1.36 resyncs a pod in back-off once the back-off expires,
    // jittered by up to half of it (`MinBackoffExpiration`, `wait.Jitter`).
    let expected = [0.0, 10.0, 20.0, 40.0];
    for (g, e) in gaps.iter().zip(expected) {
        assert!(
            *g >= e && *g < e * 1.5 + 1.5,
            "restart gaps {gaps:?}, expected {expected:?} to 1.5 times that"
        );
    }
    for (i, c) in instances.iter().enumerate() {
        assert_eq!(
            c.annotations["io.kubernetes.container.restartCount"],
            i.to_string()
        );
    }
    // While backing off, the container waits with kubelet's reason and
    // message — written near the back-off's end, as kubelet: the next
    // back-off is 80 s jittered by up to half, so the wait (paused time)
    // allows well over 120 s.
    let p = w
        .wait_pod("crash", "CrashLoopBackOff", Duration::from_secs(300), |p| {
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
    // The pod worker retries a failed sync after 10–15 s (kubelet's
    // backOffPeriod with jitter; a pull failure carries no backoff
    // expiration); each pull waits out the image's own backoff, 10 s
    // doubling. So pulls come at least 10 s, then 20 s apart, and a sync
    // that meets the backoff reports ImagePullBackOff.
    w.wait_pod(
        "pull",
        "ImagePullBackOff",
        Duration::from_secs(120),
        |p| match waiting_reason(p, "app").as_deref() {
            Some("ImagePullBackOff") => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    let pulls: Vec<_> = w.fake.calls_to("PullImage");
    assert!(pulls.len() >= 2, "{pulls:?}");
    let gaps: Vec<f64> = pulls
        .windows(2)
        .map(|p| secs(p[1].at) - secs(p[0].at))
        .collect();
    for (i, g) in gaps.iter().enumerate() {
        let min = 10.0 * f64::from(1u32 << i);
        assert!(*g >= min - 0.5, "pull gaps {gaps:?}: gap {i} below {min} s");
    }
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
}

#[tokio::test(start_paused = true)]
async fn a_crashed_container_shows_terminated_until_the_back_off_ends() {
    // containerd 1.6 (no CRI events, as on this machine): the PLEG relists
    // each second, like kubelet's generic PLEG.
    let w = World::with(Options {
        paused: true,
        fake: keelson_cri::fake::FakeConfig {
            container_events: false,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    w.fake
        .script_exit("app", ExitScript::code(1, Duration::from_secs(1)));
    w.create_pod(
        "loop",
        json!({"terminationGracePeriodSeconds": 5, "containers": [{"name": "app", "image": IMAGE}]}),
    )
    .await;
    // Wait for the second crash (restartCount 1, terminated): the
    // back-off of 10 s starts there.
    let crashed_at = w
        .wait_pod("loop", "second crash", Duration::from_secs(60), |p| {
            let s = container_status(p, "app").ok_or("no status")?;
            match s.state.as_ref().and_then(|st| st.terminated.clone()) {
                Some(t) if s.restart_count == 1 => Ok(t.finished_at.unwrap().0),
                _ => Err(format!("{s:?}")),
            }
        })
        .await;
    let crashed_at: std::time::SystemTime = crashed_at.into();
    // Creating the container takes a moment, as on a real runtime, so the
    // status written at the back-off's end shows before the restart.
    w.fake
        .set_latency("CreateContainer", Duration::from_millis(600));
    // Observe the status through the back-off: terminated/Error until
    // about its end, then waiting/CrashLoopBackOff, then the restart.
    let seen_cell: std::sync::Mutex<Vec<(f64, String)>> = std::sync::Mutex::new(Vec::new());
    wait_for(
        "restart after the back-off",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let w = &w;
            let seen_cell = &seen_cell;
            async move {
                let p = w.get("loop").await.ok_or("gone")?;
                let s = container_status(&p, "app").ok_or("no status")?.clone();
                let now = w.clock.now();
                let at = now
                    .duration_since(crashed_at)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                let st = s.state.clone().unwrap_or_default();
                let what = if let Some(t) = st.terminated {
                    format!("terminated/{}", t.reason.unwrap_or_default())
                } else if let Some(wt) = st.waiting {
                    format!("waiting/{}", wt.reason.unwrap_or_default())
                } else {
                    "running".to_string()
                };
                let mut seen = seen_cell.lock().unwrap();
                if seen.last().map(|(_, x)| x) != Some(&what) {
                    seen.push((at, what.clone()));
                }
                if s.restart_count >= 2 {
                    Ok(())
                } else {
                    Err(format!("{seen:?}"))
                }
            }
        },
    )
    .await
    .unwrap();
    let seen = seen_cell.into_inner().unwrap();
    let first = &seen[0];
    assert_eq!(first.1, "terminated/Error", "{seen:?}");
    let backoff = seen
        .iter()
        .find(|(_, x)| x == "waiting/CrashLoopBackOff")
        .unwrap_or_else(|| panic!("CrashLoopBackOff shown before the restart: {seen:?}"));
    assert!(
        backoff.0 >= 9.5,
        "CrashLoopBackOff only at the back-off's end: {seen:?}"
    );
}
