//! A hand-on's announcement carries its taker's answer on PostgreSQL (schema 26,
//! `autocomp_announce_handed`): the taker's notice holds the run as its read of its handed
//! runs would answer it, so a stage handed on costs the taker no read; an answer too large
//! for a notification, or one a role that may connect forged, is not worked: the taker is
//! told, and reads; one it replayed carries its run once.

use std::time::{Duration, Instant};

use autocomp_model::*;
use autocomp_store::*;
use autocomp_test_servers::postgres::{Options, Postgres, shared};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls};

fn id(text: &str) -> BatchId {
    BatchId::new(text).unwrap()
}

fn step(name: &str, requires: &str, produces: &str) -> ComponentDescriptor {
    let trigger = Trigger::builder().requires(requires).blocked_by(produces).build();
    ComponentDescriptor::new(ComponentName::new(name).unwrap(), "1.0", produces.parse().unwrap(), trigger)
}

fn taker(name: &str) -> RunHolder {
    RunHolder {
        agent: Agent::new(format!("{name}/1.0@host#1")).unwrap(),
        host: "host".into(),
        pid: 1,
        claim_key: None,
        liveness: Some(format!("pg:{name}")),
    }
}

/// The takers' handle with the checker and the archiver offered through it, the writers'
/// handle (another process's, as a pipeline's appender is), and the two steps.
async fn checker_and_archiver(url: &str) -> (PgStore, PgStore, ComponentDescriptor, ComponentDescriptor) {
    let takers = PgStore::open(url).await.unwrap();
    let writer = PgStore::open(url).await.unwrap();
    let (checker, archiver) = (step("checker", "Data_Received", "Checked"), step("archiver", "Checked", "Archived"));
    for (descriptor, name) in [(&checker, "checker"), (&archiver, "archiver")] {
        let offer = TakerOffer { descriptor: descriptor.clone(), holder: taker(name) };
        assert!(takers.offer_to_take(offer).await.unwrap(), "the store keeps takers");
    }
    (takers, writer, checker, archiver)
}

/// A connection of the test's own, for the SQL it runs beside the store handles.
async fn sql_client(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// The taker's notice from its last mark on, asked until its handle hears announcements.
async fn notice(store: &PgStore, descriptor: &ComponentDescriptor, since: Option<AnnouncementMark>) -> HandOnNotice {
    let liveness = format!("pg:{}", descriptor.name);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let notice = store.hand_on_notice(descriptor, &liveness, since).await;
        if notice.mark.is_some() {
            return notice;
        }
        assert!(Instant::now() < deadline, "the handle hears announcements within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The notice after a hand-on, once its announcement reached the handle.
async fn told(store: &PgStore, descriptor: &ComponentDescriptor, since: AnnouncementMark) -> HandOnNotice {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let notice = notice(store, descriptor, Some(since)).await;
        if notice.handed != Some(false) {
            return notice;
        }
        assert!(Instant::now() < deadline, "the hand-on is announced within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the taker reads of its handed runs, each batch's clock set aside (the announcement's
/// is its commit's, the read's its own).
async fn read(store: &PgStore, descriptor: &ComponentDescriptor) -> Vec<ReadyAnswer> {
    let liveness = format!("pg:{}", descriptor.name);
    store.handed_runs(descriptor, &liveness).await.unwrap()
}

fn clock_aside(mut answers: Vec<ReadyAnswer>) -> Vec<ReadyAnswer> {
    for answer in &mut answers {
        answer.batch.as_of = Timestamp(0);
    }
    answers
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hand_on_announces_what_its_taker_would_read_and_one_too_large_is_read() {
    let url = shared().unique_database();
    let (takers, writer, checker, archiver) = checker_and_archiver(&url).await;
    let (checking, archiving) = (notice(&takers, &checker, None).await, notice(&takers, &archiver, None).await);

    // A registration handed on: its announcement carries the new batch and the run.
    let delivered = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, Agent::new("trigger").unwrap())
        .with_details(json!({"pages": 12, "note": "line one\nline \"two\""}));
    let new = NewBatch::new(id("C1"), "Delivery".parse().unwrap());
    let registered = writer.register_handing_on(new, delivered, std::slice::from_ref(&checker.name)).await.unwrap();
    assert_eq!(registered.runs.len(), 1, "{registered:?}");
    let told_checker = told(&takers, &checker, checking.mark.unwrap()).await;
    assert_eq!(told_checker.handed, Some(true));
    let carried = told_checker.runs.clone().expect("the registration's announcement carried the run");
    assert_eq!(clock_aside(carried.clone()), clock_aside(read(&takers, &checker).await));
    assert_eq!(carried[0].claim.as_ref().unwrap().run, registered.runs[0]);
    assert!(carried[0].batch.open_runs.is_empty(), "the batch as it was before its handed run: {carried:?}");

    // The checker's result hands the batch on to the archiver, its announcement carrying it.
    let claim = carried[0].claim.clone().unwrap();
    let checked = NewEvent::new("Checked".parse().unwrap(), Outcome::Success, Agent::new("checker").unwrap())
        .in_run(checker.name.clone(), claim.generation());
    let handed = writer.append_handing_on(&id("C1"), checked, std::slice::from_ref(&archiver.name)).await.unwrap();
    assert_eq!(handed.runs.len(), 1, "{handed:?}");
    let told_archiver = told(&takers, &archiver, archiving.mark.unwrap()).await;
    let carried = told_archiver.runs.clone().expect("the append's announcement carried the run");
    assert_eq!(clock_aside(carried.clone()), clock_aside(read(&takers, &archiver).await));
    let types: Vec<&str> = carried[0].batch.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["Data_Received", "Checked"], "with the result that handed it on");
    assert_eq!(notice(&takers, &checker, told_checker.mark).await.handed, Some(false), "the checker told once");

    // A batch whose answer would not fit a notification (8,000 bytes): told, and read.
    let since = notice(&takers, &checker, told_checker.mark).await.mark.unwrap();
    let large = NewBatch {
        metadata: json!({"notes": "x".repeat(9_000)}),
        ..NewBatch::new(id("C2"), "Delivery".parse().unwrap())
    };
    let delivered = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, Agent::new("trigger").unwrap());
    // The checker is idle again: its result closed its run.
    let registered = writer.register_handing_on(large, delivered, std::slice::from_ref(&checker.name)).await.unwrap();
    assert_eq!(registered.runs.len(), 1, "{registered:?}");
    let told_large = told(&takers, &checker, since).await;
    assert_eq!(told_large.handed, Some(true), "told of it");
    assert_eq!(told_large.runs, None, "without the answer, which did not fit");
    let read_large = read(&takers, &checker).await;
    assert_eq!(read_large.len(), 1);
    assert_eq!(read_large[0].batch.id, id("C2"), "read instead");
}

/// A connection of the test's own, as any role that may connect holds one: it hears what is
/// announced on `autocomp_handed` and may notify anything.
async fn stranger(url: &str) -> (Client, mpsc::UnboundedReceiver<String>) {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    let (heard, hearing) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let Ok(AsyncMessage::Notification(notified)) = message {
                let _ = heard.send(notified.payload().to_owned());
            }
        }
    });
    client.batch_execute("LISTEN autocomp_handed").await.unwrap();
    (client, hearing)
}

async fn overheard(hearing: &mut mpsc::UnboundedReceiver<String>) -> String {
    let heard = tokio::time::timeout(Duration::from_secs(10), hearing.recv()).await;
    heard.expect("an announcement within 10 s").expect("the stranger's connection is up")
}

async fn hand_to_checker(writer: &PgStore, checker: &ComponentDescriptor, batch: &str) -> Run {
    let delivered = NewEvent::new("Data_Received".parse().unwrap(), Outcome::Success, Agent::new("trigger").unwrap());
    let new = NewBatch::new(id(batch), "Delivery".parse().unwrap());
    let registered = writer.register_handing_on(new, delivered, std::slice::from_ref(&checker.name)).await.unwrap();
    assert_eq!(registered.runs.len(), 1, "{registered:?}");
    registered.runs[0].clone()
}

/// Any role that may connect may LISTEN and NOTIFY. What it forges (a batch that does not
/// exist, a claim seq far ahead), alters or replays to another taker is not sealed with the
/// taker's key: the taker is told of a hand-on and reads, and works nothing it was not
/// handed; its next real announcement is carried again. What it replays whole carries the
/// run once, however often and whenever it is heard.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_altered_or_replayed_announcement_is_read_not_worked() {
    let url = shared().unique_database();
    let (takers, writer, checker, archiver) = checker_and_archiver(&url).await;
    let (client, mut hearing) = stranger(&url).await;
    let (checking, archiving) = (notice(&takers, &checker, None).await, notice(&takers, &archiver, None).await);

    // The real one: carried, and overheard.
    let run = hand_to_checker(&writer, &checker, "F1").await;
    let real = told(&takers, &checker, checking.mark.unwrap()).await;
    assert_eq!(real.runs.as_ref().map(Vec::len), Some(1), "the real announcement is carried");
    let payload = overheard(&mut hearing).await;
    let (header, sealed) = payload.split_at("checker pg:checker ".len());
    assert_eq!(header, "checker pg:checker ");
    let (seal, answer) = sealed.split_once(' ').unwrap();
    assert_eq!(seal.len(), 64, "a hex HMAC-SHA256: {seal}");

    let claim_seq = format!("\"claim_seq\": {}", run.claim_seq.0);
    let far_ahead = answer.replace(&claim_seq, "\"claim_seq\": 9000000000000");
    assert_ne!(far_ahead, answer, "the run's claim seq is in the answer: {answer}");
    let forgeries = [
        // The real answer, altered: another batch under the real seal.
        format!("checker pg:checker {seal} {}", answer.replace("\"F1\"", "\"F9\"")),
        // A made-up answer with a claim seq far ahead, under a made-up seal.
        format!("checker pg:checker {} {}", "0".repeat(64), far_ahead),
        // The real one, whole, again: its run was carried once already.
        payload.clone(),
    ];
    let mut mark = real.mark.unwrap();
    for (n, forged) in forgeries.iter().enumerate() {
        client.execute("SELECT pg_notify('autocomp_handed', $1)", &[forged]).await.unwrap();
        let forged_notice = told(&takers, &checker, mark).await;
        assert_eq!(forged_notice.handed, Some(true), "forgery {n}: told of a hand-on");
        match n {
            2 => assert_eq!(forged_notice.runs, Some(Vec::new()), "a replay carries nothing a second time"),
            _ => assert_eq!(forged_notice.runs, None, "forgery {n} is not carried: the taker reads"),
        }
        mark = forged_notice.mark.unwrap();
    }
    // The real one replayed to another taker of this handle: not its seal.
    let replayed = format!("archiver pg:archiver {seal} {answer}");
    client.execute("SELECT pg_notify('autocomp_handed', $1)", &[&replayed]).await.unwrap();
    let to_archiver = told(&takers, &archiver, archiving.mark.unwrap()).await;
    assert_eq!((to_archiver.handed, to_archiver.runs), (Some(true), None), "replayed to the archiver: read");
    assert!(read(&takers, &archiver).await.is_empty(), "and the read finds nothing handed to it");
    let read_checker = read(&takers, &checker).await;
    assert_eq!(read_checker.len(), 1, "the checker reads its one real run: {read_checker:?}");
    assert_eq!(read_checker[0].batch.id, id("F1"));

    // The checker's result hands F1 on to the archiver: carried again after the forgery.
    let checked = NewEvent::new("Checked".parse().unwrap(), Outcome::Success, Agent::new("checker").unwrap())
        .in_run(checker.name.clone(), run.generation);
    let handed = writer.append_handing_on(&id("F1"), checked, std::slice::from_ref(&archiver.name)).await.unwrap();
    assert_eq!(handed.runs.len(), 1, "{handed:?}");
    // Overheard and notified twice more before the archiver asks; then a forgery to the
    // checker, which the takers' handle hears after both (one session's notifications arrive
    // in the order sent).
    let to_archive = loop {
        let payload = overheard(&mut hearing).await;
        if payload.starts_with("archiver ") && payload != replayed {
            break payload;
        }
    };
    for _ in 0..2 {
        client.execute("SELECT pg_notify('autocomp_handed', $1)", &[&to_archive]).await.unwrap();
    }
    client.execute("SELECT pg_notify('autocomp_handed', $1)", &[&forgeries[1]]).await.unwrap();
    assert_eq!(told(&takers, &checker, mark).await.runs, None, "the fence: the forgery heard");
    let next = told(&takers, &archiver, to_archiver.mark.unwrap()).await;
    let carried = next.runs.expect("the next real announcement is carried");
    assert_eq!(carried.len(), 1, "told three times, carried once: {carried:?}");
    assert_eq!(clock_aside(carried), clock_aside(read(&takers, &archiver).await));
    // Heard again after it was carried: told, carrying nothing.
    client.execute("SELECT pg_notify('autocomp_handed', $1)", &[&to_archive]).await.unwrap();
    let again = told(&takers, &archiver, next.mark.unwrap()).await;
    assert_eq!((again.handed, again.runs), (Some(true), Some(Vec::new())), "a replay later carries nothing");
}

/// The store's seqs going back under a running taker (a failover to a standby that missed
/// commits, a restore; here `setval`): a run at or below the newest its handle carried, and
/// not one of those it carried, is not dropped as a replay: the taker is told, and reads it.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_below_the_newest_carried_is_read_not_dropped() {
    let url = shared().unique_database();
    let (takers, writer, checker, _) = checker_and_archiver(&url).await;
    let client = sql_client(&url).await;
    let checking = notice(&takers, &checker, None).await;

    client.execute("SELECT setval('store_seq', 1000)", &[]).await.unwrap();
    let first = hand_to_checker(&writer, &checker, "S1").await;
    let carried = told(&takers, &checker, checking.mark.unwrap()).await;
    assert_eq!(carried.runs.as_ref().map(Vec::len), Some(1), "carried");
    // Its result: the checker is idle again.
    let checked = NewEvent::new("Checked".parse().unwrap(), Outcome::Success, Agent::new("checker").unwrap())
        .in_run(checker.name.clone(), first.generation);
    writer.append_event(&id("S1"), checked).await.unwrap();

    client.execute("SELECT setval('store_seq', 10)", &[]).await.unwrap();
    let second = hand_to_checker(&writer, &checker, "S2").await;
    assert!(second.claim_seq < first.claim_seq, "{second:?} after {first:?}");
    let below = told(&takers, &checker, carried.mark.unwrap()).await;
    assert_eq!((below.handed, below.runs), (Some(true), None), "told, and read");
    let read = read(&takers, &checker).await;
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!(read[0].batch.id, id("S2"));
}

/// A taker whose offer left no key (a release before schema 26's seal, or a handle with
/// `listen=off`) is announced its runs as schema 25 did (`h:`): told, and it reads. Two
/// appends to one batch in one group announce the hand-on once both are written: what it
/// carries holds the later event too.
#[tokio::test(flavor = "multi_thread")]
async fn a_taker_without_a_key_reads_and_a_group_announces_once_written() {
    let url = shared().unique_database();
    let (takers, writer, checker, archiver) = checker_and_archiver(&url).await;
    let client = sql_client(&url).await;
    let (checking, archiving) = (notice(&takers, &checker, None).await, notice(&takers, &archiver, None).await);

    client.execute("UPDATE takers SET announcement_key = NULL WHERE component = 'checker'", &[]).await.unwrap();
    let run = hand_to_checker(&writer, &checker, "G1").await;
    let unsealed = told(&takers, &checker, checking.mark.unwrap()).await;
    assert_eq!((unsealed.handed, unsealed.runs), (Some(true), None), "told without the answer");
    assert_eq!(read(&takers, &checker).await.len(), 1, "and read");

    // One group: the checker's result handing G1 on, then an operator's note on G1.
    let group =
        "SELECT r_refused, r_handed::text FROM autocomp_append_group(ARRAY['G1', 'G1'], ARRAY['Checked', 'Noted'],
            ARRAY['success', 'success'], ARRAY['checker/1.0@host#1', 'operator'], ARRAY['{}'::jsonb, '{}'::jsonb],
            ARRAY['checker', NULL], ARRAY[$1::bigint, NULL], ARRAY[NULL, NULL]::jsonb[], ARRAY[NULL, NULL]::text[],
            1000000, ARRAY['[\"archiver\"]'::jsonb, NULL])";
    let rows = client.query(group, &[&run.generation]).await.unwrap();
    let refused: Vec<Option<String>> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(refused, [None, None], "both appended");
    assert!(rows[0].get::<_, Option<String>>(1).is_some(), "the first handed G1 on");
    let to_archiver = told(&takers, &archiver, archiving.mark.unwrap()).await;
    let carried = to_archiver.runs.expect("carried");
    let types: Vec<&str> = carried[0].batch.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["Data_Received", "Checked", "Noted"], "with the group's later append");
    assert_eq!(clock_aside(carried), clock_aside(read(&takers, &archiver).await));

    // A handle that hears no announcements (`listen=off`) leaves no key: no writer builds an
    // answer for it.
    let deaf = PgStore::open(&format!("{url}{}listen=off", if url.contains('?') { "&" } else { "?" })).await.unwrap();
    let offer = TakerOffer { descriptor: archiver.clone(), holder: taker("deaf") };
    assert!(deaf.offer_to_take(offer).await.unwrap(), "the store keeps takers");
    let keyed: Option<bool> = client
        .query_one("SELECT announcement_key IS NOT NULL FROM takers WHERE liveness = 'pg:deaf'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(keyed, Some(false), "a taker that hears nothing keeps no key");
}

/// While the server's notification queue is past 1% full (a listener stalled: here a session
/// left in a transaction), hand-ons are announced without their answers (`h:`, a tenth to a
/// hundredth of the bytes), so the queue fills that much slower before commits fail; once
/// the listener catches up, they carry their answers again. A server of its own: the queue
/// is the whole server's.
#[tokio::test(flavor = "multi_thread")]
async fn a_filling_notification_queue_is_announced_to_without_answers() {
    let server = Postgres::start_with(Options { fsync: false, ..Options::default() });
    let url = server.unique_database();
    let takers = PgStore::open(&url).await.unwrap();
    let writer = PgStore::open(&url).await.unwrap();
    let checker = step("checker", "Data_Received", "Checked");
    let offer = TakerOffer { descriptor: checker.clone(), holder: taker("checker") };
    assert!(takers.offer_to_take(offer).await.unwrap(), "the store keeps takers");
    let checking = notice(&takers, &checker, None).await;

    // A listener that stops reading: in a transaction, its session takes in no notification.
    let (stalled, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    // Two messages: a LISTEN takes effect when its transaction commits, and a BEGIN later in
    // the same query string would have made it part of the transaction left open.
    stalled.batch_execute("LISTEN autocomp_store_changed").await.unwrap();
    stalled.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let (filler, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let fill = "SELECT count(pg_notify('filler', repeat('y', 7900) || i)) FROM generate_series(1, 12000) i";
    filler.batch_execute(fill).await.unwrap();
    let usage = "SELECT pg_notification_queue_usage()";
    let used: f64 = filler.query_one(usage, &[]).await.unwrap().get(0);
    assert!(used > 0.01, "the queue is past 1% full: {used}");

    hand_to_checker(&writer, &checker, "Q1").await;
    let told_full = told(&takers, &checker, checking.mark.unwrap()).await;
    assert_eq!((told_full.handed, told_full.runs), (Some(true), None), "told without the answer, and read");
    let run = read(&takers, &checker).await.remove(0).claim.unwrap().run;

    // The listener ends its transaction and reads on: the queue empties.
    stalled.batch_execute("COMMIT").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while filler.query_one(usage, &[]).await.unwrap().get::<_, f64>(0) >= 0.01 {
        assert!(Instant::now() < deadline, "the queue empties within 30 s of its listener reading on");
        // Its tail moves when a listener catches up: each notification wakes them to.
        filler.batch_execute("NOTIFY filler").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let checked = NewEvent::new("Checked".parse().unwrap(), Outcome::Success, Agent::new("checker").unwrap())
        .in_run(checker.name.clone(), run.generation);
    writer.append_event(&id("Q1"), checked).await.unwrap();
    hand_to_checker(&writer, &checker, "Q2").await;
    let told_again = told(&takers, &checker, told_full.mark.unwrap()).await;
    let carried = told_again.runs.expect("carried again");
    assert_eq!(carried[0].batch.id, id("Q2"));
}
