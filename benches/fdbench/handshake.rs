//! The run secret's cost: forming the ring and talking to the store, with no secret (every
//! connection taken, as before secrets) and with one (every connection's HMAC handshake).
//!
//! All in this process over loopback, the two sides alternating round by round (open first on
//! even rounds, gated first on odd). Prints one JSON line per round and side.
use flightdeck::collective::auth::{Gate, RunSecret};
use flightdeck::collective::rendezvous::{StoreClient, StoreServer};
use flightdeck::collective::ring::Ring;
use flightdeck::ids::Rank;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);
/// Round trips timed per round for the request latency.
const REQUESTS: u32 = 200;

fn gate(gated: bool) -> anyhow::Result<Gate> {
    Ok(match gated {
        true => Gate::new(RunSecret::generate()?, Arc::new(|r| eprintln!("refused: {r:?}"))),
        false => Gate::open(),
    })
}

fn store(gate: &Gate) -> anyhow::Result<String> {
    let server = StoreServer::bind("127.0.0.1:0", gate.clone())?;
    let addr = server.local_addr().to_string();
    server.spawn();
    Ok(addr)
}

/// Milliseconds from a common start until the last of `world` ranks has its ring.
fn form_ring(world: u32, gate: &Gate) -> anyhow::Result<f64> {
    let addr = store(gate)?;
    let start = Arc::new(Barrier::new(world as usize + 1));
    let ranks: Vec<_> = (0..world)
        .map(|r| {
            let (addr, gate, start) = (addr.clone(), gate.clone(), Arc::clone(&start));
            std::thread::spawn(move || -> anyhow::Result<(Ring, Instant)> {
                start.wait();
                let mut store = StoreClient::connect(&addr, &gate, TIMEOUT)?;
                let ring = Ring::connect(&mut store, Rank(r), world, "127.0.0.1", TIMEOUT, &gate)?;
                Ok((ring, Instant::now()))
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let mut last = t0;
    for rank in ranks {
        let (_ring, done) = rank.join().map_err(|_| anyhow::anyhow!("a rank panicked"))??;
        last = last.max(done);
    }
    Ok((last - t0).as_secs_f64() * 1e3)
}

/// Microseconds: a new client's connect (with its handshake) and first set; then the median of
/// `REQUESTS` set-and-get round trips on that connection.
fn talk_to_store(gate: &Gate) -> anyhow::Result<(f64, f64)> {
    let addr = store(gate)?;
    let t0 = Instant::now();
    let mut client = StoreClient::connect(&addr, gate, TIMEOUT)?;
    client.set("k", b"v")?;
    let connect_us = t0.elapsed().as_secs_f64() * 1e6;
    let mut times: Vec<f64> = (0..REQUESTS)
        .map(|_| {
            let t = Instant::now();
            client.set("k", b"value")?;
            client.get("k", Duration::ZERO)?;
            Ok(t.elapsed().as_secs_f64() * 1e6 / 2.0)
        })
        .collect::<anyhow::Result<_>>()?;
    times.sort_by(f64::total_cmp);
    Ok((connect_us, times[times.len() / 2]))
}

pub fn main(rounds: u64) -> anyhow::Result<()> {
    for round in 0..rounds {
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        for gated in order {
            let gate = gate(gated)?;
            let ring2_ms = form_ring(2, &gate)?;
            let ring4_ms = form_ring(4, &gate)?;
            let (connect_us, request_us) = talk_to_store(&gate)?;
            let side = if gated { "secret" } else { "open" };
            println!(
                "{{\"round\": {round}, \"side\": \"{side}\", \"ring2_ms\": {ring2_ms}, \"ring4_ms\": {ring4_ms}, \
                 \"connect_us\": {connect_us}, \"request_us\": {request_us}}}"
            );
        }
    }
    Ok(())
}
