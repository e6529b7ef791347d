//! The cost of one `status` poll of a 1,000-config sweep: scheduler commands,
//! event files and bytes read, milliseconds. A real sweep on the `local`
//! transport (the rendered array runs as local processes): each task writes a
//! worker-like `events.jsonl` (start, 40 heartbeats, phase ends, result). The
//! first poll after the sweep ended reads every newly ended config's events
//! once; later polls read nothing new (incremental reads: a byte offset per
//! attempt). Run with `cargo bench -p orchestrator --bench poll`.

use orchestrator::submit::{self, Options};
use orchestrator::sweep;
use std::time::{Duration, Instant};

const N: usize = 1000;

/// A job that writes what a worker writes, as fast as bash can.
const TEMPLATE: &str = r#"#!/bin/bash
#SBATCH --job-name={{sbatch job_name}}
#SBATCH --array={{sbatch array}}
#SBATCH --output={{sbatch log_dir}}/%a.out
#SBATCH --chdir={{sbatch submission_dir}}
set -eu
name=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {{sh manifest_jsonl}} | grep -o '"name":"[^"]*"' | head -1 | cut -d'"' -f4)
hash=$(grep "^$name	" {{sh state_dir}}/hashes.tsv | cut -f2)
d={{sh state_dir}}/{{sh experiment}}/runs/$hash
mkdir -p "$d"
{
printf '{"event":"start","t":1.0,"config":"%s","config_hash":"%s","env":{"host":"h","device":"cpu","backend":"flex","dtype":"f32","grad_ckpt":false,"slurm_job_id":"%s"}}\n' "$name" "$hash" "$SLURM_JOB_ID"
for i in $(seq 1 40); do printf '{"event":"heartbeat","t":2.0,"phase":"fwd","current_bytes":1000,"peak_bytes":%s}\n' "$((i * 1000))"; done
for p in model fwd bwd step; do printf '{"event":"phase_end","t":3.0,"phase":"%s","peak_bytes":40000,"seconds":0.1}\n' "$p"; done
printf '{"event":"result","t":4.0,"status":"ok","params":1000,"peaks":{"model":1,"fwd":2,"bwd":3,"step":4},"peak_bytes":40000,"wall_s":3.0}\n'
} > "$d/events.jsonl"
"#;

fn main() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    std::fs::write(dir.join("clusters.yaml"), "clusters:\n  local:\n    transport: local\n    max_parallel: 16\n")
        .expect("clusters");
    std::fs::write(dir.join("bench.sbatch.hbs"), TEMPLATE).expect("template");
    let batches: Vec<String> = (1..=N).map(|b| b.to_string()).collect();
    let exp = format!(
        "name: pollbench\ncluster: local\ngpu: A100-SXM4-80GB\nprecision: fp32\n\
         input: {{channels: 1, spatial: [16, 16, 16]}}\noutput_channels: 1\n\
         model: {{family: unet, channels: [32, 64], attention_levels: [false, false], num_res_blocks: 1, num_head_channels: 32}}\n\
         template: {}\nsweep:\n  name: \"b{{batch}}\"\n  grid:\n    batch: [{}]\n",
        dir.join("bench.sbatch.hbs").display(),
        batches.join(", ")
    );
    let file = dir.join("pollbench.yaml");
    std::fs::write(&file, exp).expect("experiment");
    let opts = Options {
        state_root: dir.join("state"),
        clusters_file: Some(dir.join("clusters.yaml")),
        template_dirs: vec![],
        // Every config runs (the large batches are predicted risky on the GPU named): polls are measured, not verdicts.
        force: true,
        ..Options::default()
    };
    let sweep = sweep::load(&file, &[]).expect("experiment loads");
    // Runs are kept by their config's hash, which the worker computes: here, a table the job reads.
    let hashes: String = sweep.configs.iter().map(|c| format!("{}\t{}\n", c.name, c.hash)).collect();
    std::fs::create_dir_all(&opts.state_root).expect("state root");
    std::fs::write(opts.state_root.join("hashes.tsv"), hashes).expect("hashes");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let t = Instant::now();
    let rep = rt.block_on(submit::submit(&sweep, &opts, false)).expect("submit");
    assert_eq!(rep.submitted.len(), N);
    println!("submit {N} configs: {:.0} ms, {} commands", t.elapsed().as_secs_f64() * 1e3, rep.counters.commands);
    // Wait for the local runner to finish every task (without polling: that is what is measured).
    let jobs = dir.join("state").join(".local-jobs");
    let t = Instant::now();
    loop {
        let done = std::fs::read_dir(&jobs)
            .map(|rd| rd.flatten().filter(|e| e.path().is_dir()).all(|e| e.path().join("finished").exists()))
            .unwrap_or(false);
        if done {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(600), "the sweep did not finish");
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("{N} tasks ran in {:.1} s", t.elapsed().as_secs_f64());
    println!("{:<34} {:>9} {:>11} {:>12} {:>9}", "poll", "commands", "event files", "bytes read", "ms");
    for label in ["1st (all 1,000 newly ended)", "2nd (nothing new)", "3rd (nothing new)"] {
        let t = Instant::now();
        let r = rt.block_on(submit::status("pollbench", &opts, None, &mut |_| {})).expect("status");
        let ms = t.elapsed().as_secs_f64() * 1e3;
        println!(
            "{label:<34} {:>9} {:>11} {:>12} {:>9.1}",
            r.poll.commands, r.poll.events_files, r.poll.events_bytes, ms
        );
        assert!(r.settled || label.starts_with("1st"), "{}", r.table());
    }
}
