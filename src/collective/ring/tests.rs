//! Ring tests: whole worlds of ranks as threads in this process, over loopback.
use super::*;
use crate::collective::auth::RunSecret;
use crate::collective::recorder::FlightRecorder;
use crate::collective::rendezvous::StoreServer;
use std::io::{Read, Write};
use std::sync::{mpsc, Arc};

const LENGTHS: [usize; 6] = [0, 1, 3, 7, 1000, (1 << 20) + 5];
/// Not a timing assertion: a deadlock fails the test instead of hanging the whole suite.
const HANG_GUARD: Duration = Duration::from_secs(120);

const BOTH: [SharedMemory; 2] = [SharedMemory::WhenLocal, SharedMemory::Never];

/// Runs `body` on every rank of a fresh world (its own store) and returns results by rank.
fn run_world<T, F>(world_size: u32, body: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Ring) -> T + Send + Sync + 'static,
{
    run_world_with(world_size, SharedMemory::WhenLocal, body)
}

/// `run_world` over the shared-memory path (every rank here is on one machine) or TCP alone.
fn run_world_with<T, F>(world_size: u32, shared: SharedMemory, body: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Ring) -> T + Send + Sync + 'static,
{
    let gate = Gate::new(RunSecret::generate().unwrap(), Arc::new(|r| panic!("refused a rank of the run: {r:?}")));
    let server = StoreServer::bind("127.0.0.1:0", gate.clone()).unwrap();
    let addr = server.local_addr().to_string();
    server.spawn();
    let body = Arc::new(body);
    let (tx, rx) = mpsc::channel();
    let handles: Vec<_> = (0..world_size)
        .map(|r| {
            let (addr, body, tx, gate) = (addr.clone(), Arc::clone(&body), tx.clone(), gate.clone());
            std::thread::spawn(move || {
                let mut store = StoreClient::connect(&addr, &gate, Duration::from_secs(10)).unwrap();
                let timeout = Duration::from_secs(30);
                let ring =
                    Ring::connect_with(&mut store, Rank(r), world_size, "127.0.0.1", timeout, &gate, shared).unwrap();
                assert_eq!((ring.rank(), ring.world_size()), (Rank(r), world_size));
                let want_shared = world_size > 1 && shared == SharedMemory::WhenLocal;
                assert_eq!(ring.shares_memory(), want_shared, "rank {r} of {world_size}, {shared:?}");
                tx.send((r, body(ring))).unwrap();
            })
        })
        .collect();
    drop(tx);
    let mut results: Vec<_> =
        (0..world_size).map(|_| rx.recv_timeout(HANG_GUARD).expect("a rank hung or panicked")).collect();
    for h in handles {
        h.join().unwrap();
    }
    results.sort_by_key(|(r, _)| *r);
    results.into_iter().map(|(_, t)| t).collect()
}

/// Distinct small integers per rank and index, so f32 sums over 4 ranks stay exact.
fn small_int(rank: u32, i: usize) -> f32 {
    (rank as usize * 1000 + (i * 7 + rank as usize * 13) % 101) as f32
}

#[test]
fn all_reduce_sums_exactly_for_every_world_and_length() {
    for (world_size, shared) in (1..=4u32).flat_map(|w| BOTH.map(|s| (w, s))) {
        let results = run_world_with(world_size, shared, |mut ring| {
            let rank = ring.rank().0;
            LENGTHS
                .iter()
                .map(|&len| {
                    let mut buf: Vec<f32> = (0..len).map(|i| small_int(rank, i)).collect();
                    ring.all_reduce_sum(&mut buf).unwrap();
                    ring.barrier().unwrap();
                    buf
                })
                .collect::<Vec<_>>()
        });
        for (rank, bufs) in results.iter().enumerate() {
            for (buf, &len) in bufs.iter().zip(&LENGTHS) {
                assert_eq!(buf.len(), len);
                let wrong = (0..len).find(|&i| {
                    let want: f32 = (0..world_size).map(|r| small_int(r, i)).sum();
                    buf[i] != want
                });
                assert_eq!(wrong, None, "world {world_size}, rank {rank}, length {len}, {shared:?}");
            }
        }
    }
}

/// xorshift64*: deterministic per-rank floats without a rand dependency.
fn random_floats(seed: u64, len: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let bits = s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 random bits
            bits as f32 / (1u64 << 23) as f32 - 1.0 // in [-1, 1)
        })
        .collect()
}

/// Also across the two paths: a run's losses must not depend on whether its ranks shared a
/// machine (the shared-memory sums follow the ring's order element by element).
#[test]
fn random_floats_end_bit_identical_on_every_rank_and_path() {
    for (world_size, len) in [(2u32, 777usize), (3, 1000), (3, (1 << 19) + 1), (4, (1 << 20) + 5)] {
        let [results, over_tcp] = BOTH.map(|shared| {
            run_world_with(world_size, shared, move |mut ring| {
                let mut buf = random_floats(u64::from(ring.rank().0) + 1, len);
                ring.all_reduce_sum(&mut buf).unwrap();
                buf
            })
        });
        for (rank, buf) in results.iter().chain(&over_tcp).enumerate().skip(1) {
            let same = buf.iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "world {world_size}, length {len}: result {rank} (of both paths' ranks) differs from rank 0");
        }
        let inputs: Vec<_> = (1..=u64::from(world_size)).map(|s| random_floats(s, len)).collect();
        for (i, got) in results[0].iter().enumerate() {
            let exact: f64 = inputs.iter().map(|v| f64::from(v[i])).sum();
            // Three f32 roundings of partial sums below 4 in magnitude.
            assert!((f64::from(*got) - exact).abs() < 1e-5, "element {i}: {got} vs {exact}");
        }
    }
}

#[test]
fn a_dropped_rank_makes_the_others_fail_instead_of_hang() {
    for shared in BOTH {
        a_dropped_rank_fails_the_others(shared);
    }
}

fn a_dropped_rank_fails_the_others(shared: SharedMemory) {
    let results = run_world_with(3, shared, |mut ring| {
        let mut buf = vec![1.0f32; 1 << 20];
        ring.all_reduce_sum(&mut buf).unwrap();
        if ring.rank() == Rank(2) {
            drop(ring);
            return None;
        }
        let first = ring.all_reduce_sum(&mut buf).unwrap_err();
        let later = ring.barrier().unwrap_err();
        Some((ring.rank().0, first, later))
    });
    for (rank, first, later) in results.into_iter().flatten() {
        match &first {
            CollectiveError::Peer { peer, addr, .. } => {
                assert_ne!(*peer, rank, "rank {rank} blamed itself: {first} ({shared:?})");
                assert!(addr.starts_with("127.0.0.1:"), "rank {rank}: {first} ({shared:?})");
            }
            other => panic!("rank {rank}: expected a peer error, got {other} ({shared:?})"),
        }
        assert!(
            matches!(&later, CollectiveError::Protocol { seq: 3, op: "barrier", reason } if reason.contains("broke")),
            "rank {rank}: {later} ({shared:?})"
        );
    }
}

#[test]
fn mismatched_sizes_are_refused_not_summed() {
    // 10 against 11 elements on either path, and an empty buffer (which stays on TCP) against
    // one element (shared memory): the waiting rank sees the other's TCP header.
    for (sizes, shared) in
        [([10, 11], SharedMemory::WhenLocal), ([10, 11], SharedMemory::Never), ([0, 1], SharedMemory::WhenLocal)]
    {
        let results = run_world_with(2, shared, move |mut ring| {
            let mut buf = vec![1.0f32; sizes[ring.rank().0 as usize]];
            ring.all_reduce_sum(&mut buf).unwrap_err()
        });
        let mismatch = results.iter().find_map(|e| match e {
            CollectiveError::Protocol { seq: 1, op: "all_reduce", reason } => Some(reason.clone()),
            _ => None,
        });
        let reason = mismatch.unwrap_or_else(|| panic!("no rank saw the mismatch: {results:?} ({shared:?})"));
        let [a, b] = sizes.map(|n| format!("of {n} elements"));
        assert!(reason.contains(&a) || reason.contains(&b), "{reason} ({shared:?})");
        if sizes[0] != 0 {
            assert!(reason.contains(&a) && reason.contains(&b), "{reason} ({shared:?})");
        }
    }
}

#[test]
fn shared_memory_segments_leave_no_file_behind() {
    let results = run_world(3, |mut ring| {
        // Looked at while the segments are mapped and in use: the files are gone already.
        let path = ring.segment_path().expect("every rank here shares one machine").to_path_buf();
        let mut buf = vec![1.0f32; 300_000];
        ring.all_reduce_sum(&mut buf).unwrap();
        (path.exists(), path, buf[299_999])
    });
    for (exists, path, last) in results {
        assert!(!exists, "{} is still there", path.display());
        assert!(path.starts_with("/dev/shm"), "{}", path.display());
        assert_eq!(last, 3.0);
    }
}

#[test]
fn recorded_ring_collectives_share_sequence_numbers_across_ranks() {
    let results = run_world(2, |ring| {
        let mut recorder = FlightRecorder::new(ring, 8, Box::new(|_| {}));
        let mut buf = vec![1.0f32; 5];
        recorder.all_reduce_sum(&mut buf).unwrap();
        recorder.barrier().unwrap();
        recorder.all_reduce_sum(&mut buf).unwrap();
        let seen: Vec<_> = recorder.records().map(|r| (r.seq, r.op, r.elements)).collect();
        (buf, seen)
    });
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0].0, vec![4.0; 5]);
}

#[test]
fn bad_rendezvous_arguments_are_refused_with_the_values() {
    let server = StoreServer::bind("127.0.0.1:0", Gate::open()).unwrap();
    let addr = server.local_addr().to_string();
    server.spawn();
    let mut store = StoreClient::connect(&addr, &Gate::open(), Duration::from_secs(5)).unwrap();
    let connect = |store: &mut StoreClient, rank, world, host| {
        Ring::connect(store, Rank(rank), world, host, Duration::from_secs(1), &Gate::open()).err().unwrap()
    };
    let err = connect(&mut store, 4, 4, "127.0.0.1").to_string();
    assert!(err.contains("rank 4 is outside a world of 4"), "{err}");
    let err = connect(&mut store, 0, 2, "0.0.0.0").to_string();
    assert!(err.contains("\"0.0.0.0\" is not an address"), "{err}");
    // Nobody else joins: the wait for rank 1's address ends at the timeout, naming the key.
    let err = connect(&mut store, 0, 2, "127.0.0.1").to_string();
    assert!(err.contains(&addr_key(1)), "{err}");
}

#[test]
fn connections_without_the_secret_never_take_a_ranks_place() {
    use crate::collective::auth::CHALLENGE_BYTES;
    let secret = RunSecret::generate().unwrap();
    let (refused_tx, refused) = mpsc::channel();
    let report = Arc::new(move |r| refused_tx.send(r).unwrap());
    let gate = Gate::new(secret.clone(), report);
    let server = StoreServer::bind("127.0.0.1:0", gate.clone()).unwrap();
    let addr = server.local_addr().to_string();
    server.spawn();
    let join = |r: u32| {
        let (addr, gate) = (addr.clone(), gate.clone());
        std::thread::spawn(move || {
            let mut store = StoreClient::connect(&addr, &gate, Duration::from_secs(10)).unwrap();
            let mut ring = Ring::connect(&mut store, Rank(r), 2, "127.0.0.1", Duration::from_secs(60), &gate).unwrap();
            let mut buf = vec![r as f32 + 1.0; 1000];
            ring.all_reduce_sum(&mut buf).unwrap();
            buf
        })
    };
    let rank0 = join(0);
    // Rank 0 listens and waits for rank 1, who has not started: its port is open to anyone.
    let mut observer = StoreClient::connect(&addr, &gate, Duration::from_secs(10)).unwrap();
    let ring0 = String::from_utf8(observer.get(&addr_key(0), Duration::from_secs(60)).unwrap()).unwrap();
    let mut attackers = Vec::new();
    // 1. Says nothing at all, and stays connected through the whole formation.
    let silent = TcpStream::connect(&ring0).unwrap();
    // 2. No secret: a ring hello straight away, as a rank from before secrets would send.
    let mut plain = TcpStream::connect(&ring0).unwrap();
    plain.write_all(&hello(1, 2)).unwrap();
    plain.shutdown(std::net::Shutdown::Write).unwrap();
    attackers.push(plain.local_addr().unwrap().to_string());
    // 3. A wrong secret, with a full handshake.
    let mut wrong = TcpStream::connect(&ring0).unwrap();
    let other = RunSecret::generate().unwrap();
    assert!(crate::collective::auth::dial(&mut wrong, &other, Purpose::Ring).is_err());
    attackers.push(wrong.local_addr().unwrap().to_string());
    // 4. Replayed bytes: the genuine answer to one connection's challenge, on the next.
    let mut first = TcpStream::connect(&ring0).unwrap();
    let mut challenge = [0u8; CHALLENGE_BYTES];
    first.read_exact(&mut challenge).unwrap();
    let answer = crate::collective::auth::Answer::new(&secret, Purpose::Ring, &challenge).unwrap().bytes;
    attackers.push(first.local_addr().unwrap().to_string());
    drop(first);
    let mut replay = TcpStream::connect(&ring0).unwrap();
    replay.read_exact(&mut challenge).unwrap();
    replay.write_all(&answer).unwrap();
    attackers.push(replay.local_addr().unwrap().to_string());
    let seen: Vec<_> = (0..attackers.len()).map(|_| refused.recv_timeout(HANG_GUARD).unwrap()).collect();
    let mut peers: Vec<_> = seen.iter().map(|r| r.peer.clone()).collect();
    peers.sort();
    attackers.sort();
    assert_eq!(peers, attackers, "{seen:?}");
    assert!(seen.iter().all(|r| r.listener == "ring listener of rank 0"), "{seen:?}");
    assert!(seen.iter().any(|r| r.reason.contains("does not hold this run's secret")), "{seen:?}");
    // The replayed answer got nothing back: no proof, only the end.
    let mut rest = Vec::new();
    assert_eq!(replay.read_to_end(&mut rest).unwrap_or(0), 0);
    // Only now does the real rank 1 start; the ring forms around the silent connection.
    let rank1 = join(1);
    let sums = [rank0.join().unwrap(), rank1.join().unwrap()];
    assert!(sums.iter().all(|b| b.iter().all(|&x| x == 3.0)), "the sum is off");
    assert_eq!(gate.refused(), attackers.len() as u64);
    drop(silent);
}

/// Prints rough all-reduce times (the 16 MiB one is the reference number); run with
/// `cargo test --release --lib ring_speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn ring_speed() {
    const ITERS: u32 = 10;
    for world_size in [2u32, 4] {
        for size_mib in [1usize, 16, 64] {
            let elements = (size_mib << 20) / 4;
            let times_ms = run_world(world_size, move |mut ring| {
                let mut buf = vec![1.0f32; elements];
                ring.all_reduce_sum(&mut buf).unwrap(); // warm up: page faults, TCP windows
                ring.barrier().unwrap();
                let start = Instant::now();
                for _ in 0..ITERS {
                    ring.all_reduce_sum(&mut buf).unwrap();
                }
                start.elapsed().as_secs_f64() * 1e3 / f64::from(ITERS)
            });
            let ms = times_ms.iter().cloned().fold(0.0, f64::max);
            let algbw_gbps = (size_mib << 20) as f64 / (ms * 1e-3) / 1e9;
            let busbw_gbps = algbw_gbps * 2.0 * f64::from(world_size - 1) / f64::from(world_size);
            println!(
                "ring all-reduce {size_mib} MiB, {world_size} ranks: {ms:.2} ms, \
                 algbw {algbw_gbps:.2} GB/s, busbw {busbw_gbps:.2} GB/s"
            );
        }
    }
}
