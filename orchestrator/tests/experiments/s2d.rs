//! exp11, exp11_1 (space-to-depth) and exp12, exp12_1 (their Haar-wavelet
//! twins) against the config list of the group's S2D script.

use orchestrator::sweep;

/// One config of the group's S2D script: its label, widths, attention per
/// level (`T`/`F`, level 0 first), res blocks per level, and the head channels
/// it names (`None`: `profile_one`'s default, 16).
type ScriptConfig = (&'static str, &'static [u32], &'static str, &'static [u32], Option<u32>);

/// The configs of the group's S2D script in its order, written by hand from
/// `misc/profiling/profile_s2d_3d_memory.py@7dc81f3:128-589` (ModeS7/AIS4900_master);
/// `std_res` = [1,1,2,2,2] and `std_attn` = L3+L4 (`:269-270`).
const S2D_SCRIPT: &[ScriptConfig] = &[
    // 3 levels (:132-185)
    ("3L [128,256,512] no-attn", &[128, 256, 512], "FFF", &[2, 2, 2], None),
    ("3L [128,256,512] attn-L2", &[128, 256, 512], "FFT", &[2, 2, 2], None),
    ("3L [128,512,1024] attn-L2", &[128, 512, 1024], "FFT", &[2, 2, 2], None),
    ("3L [256,512,512] attn-L12", &[256, 512, 512], "FTT", &[2, 2, 2], None),
    ("3L [256,512,1024] attn-L2", &[256, 512, 1024], "FFT", &[2, 2, 2], None),
    ("3L [256,512,1024] attn-L12", &[256, 512, 1024], "FTT", &[2, 2, 2], None),
    ("3L [256,512,1024] r=3,3,3 attn-L12", &[256, 512, 1024], "FTT", &[3, 3, 3], None),
    // 4 levels (:187-261)
    ("4L [64,128,256,512] no-attn", &[64, 128, 256, 512], "FFFF", &[1, 2, 2, 2], None),
    ("4L [64,128,256,512] attn-L3", &[64, 128, 256, 512], "FFFT", &[1, 2, 2, 2], None),
    ("4L [64,128,256,512] attn-L23", &[64, 128, 256, 512], "FFTT", &[1, 2, 2, 2], None),
    ("4L [64,256,512,512] attn-L23", &[64, 256, 512, 512], "FFTT", &[1, 2, 2, 2], None),
    ("4L [64,256,512,1024] attn-L23", &[64, 256, 512, 1024], "FFTT", &[1, 2, 2, 2], None),
    ("4L [128,256,512,512] attn-L23", &[128, 256, 512, 512], "FFTT", &[2, 2, 2, 2], None),
    ("4L [128,256,512,1024] attn-L23", &[128, 256, 512, 1024], "FFTT", &[2, 2, 2, 2], None),
    ("4L [128,256,512,1024] attn-L3", &[128, 256, 512, 1024], "FFFT", &[2, 2, 2, 2], None),
    ("4L [128,256,512,1024] attn-ALL", &[128, 256, 512, 1024], "TTTT", &[2, 2, 2, 2], None),
    ("4L [128,256,512,1024] r=2,2,3,3 attn-L23", &[128, 256, 512, 1024], "FFTT", &[2, 2, 3, 3], None),
    // 5 levels, widths (:263-362)
    ("5L narrow [16,32,128,256,256]", &[16, 32, 128, 256, 256], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L narrow-deep [16,32,128,256,512]", &[16, 32, 128, 256, 512], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L baseline [32,64,256,512,512]", &[32, 64, 256, 512, 512], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L progressive [32,64,128,256,512]", &[32, 64, 128, 256, 512], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L progressive-wide [64,128,256,512,1024]", &[64, 128, 256, 512, 1024], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L wider-deep [32,64,256,512,1024]", &[32, 64, 256, 512, 1024], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L wider-deep-v2 [32,64,256,1024,1024]", &[32, 64, 256, 1024, 1024], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L wider-early [64,128,256,512,512]", &[64, 128, 256, 512, 512], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L wider-early-v2 [128,128,256,512,512]", &[128, 128, 256, 512, 512], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L wider-both [64,128,512,512,1024]", &[64, 128, 512, 512, 1024], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L flat [256,256,256,256,256]", &[256, 256, 256, 256, 256], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L flat-deep [256,256,256,512,512]", &[256, 256, 256, 512, 512], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L large [64,128,512,1024,1024]", &[64, 128, 512, 1024, 1024], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L xlarge [128,256,512,1024,1024]", &[128, 256, 512, 1024, 1024], "FFFTT", &[1, 1, 2, 2, 2], None),
    // 5 levels, res blocks (:364-390)
    ("5L deep-res [32,64,256,512,512] r=2,2,3,3,3", &[32, 64, 256, 512, 512], "FFFTT", &[2, 2, 3, 3, 3], None),
    ("5L deep-res+wide [64,128,256,512,1024] r=1,1,2,3,3", &[64, 128, 256, 512, 1024], "FFFTT", &[1, 1, 2, 3, 3], None),
    ("5L uniform-r2 [32,64,256,512,1024] r=2,2,2,2,2", &[32, 64, 256, 512, 1024], "FFFTT", &[2, 2, 2, 2, 2], None),
    ("5L large-deep [64,128,512,1024,1024] r=2,2,3,3,3", &[64, 128, 512, 1024, 1024], "FFFTT", &[2, 2, 3, 3, 3], None),
    // WDM-style (:392-431)
    ("WDM-128 [64,128,128,256,256] no-attn", &[64, 128, 128, 256, 256], "FFFFF", &[2, 2, 2, 2, 2], None),
    ("WDM-128+attn34 [64,128,128,256,256]", &[64, 128, 128, 256, 256], "FFFTT", &[2, 2, 2, 2, 2], None),
    ("WDM-256 [64,128,256,512,512] no-attn", &[64, 128, 256, 512, 512], "FFFFF", &[2, 2, 2, 2, 2], None),
    ("WDM-256+attn34 [64,128,256,512,512]", &[64, 128, 256, 512, 512], "FFFTT", &[2, 2, 2, 2, 2], None),
    ("WDM-256-wider [64,128,256,512,1024] no-attn", &[64, 128, 256, 512, 1024], "FFFFF", &[2, 2, 2, 2, 2], None),
    // attention on [32,64,256,512,1024] (:433-481)
    ("5L attn-none [32,64,256,512,1024]", &[32, 64, 256, 512, 1024], "FFFFF", &[1, 1, 2, 2, 2], None),
    ("5L attn-L4 [32,64,256,512,1024]", &[32, 64, 256, 512, 1024], "FFFFT", &[1, 1, 2, 2, 2], None),
    ("5L attn-L3 [32,64,256,512,1024]", &[32, 64, 256, 512, 1024], "FFFTF", &[1, 1, 2, 2, 2], None),
    ("5L attn-L2+L4 [32,64,256,512,1024]", &[32, 64, 256, 512, 1024], "FFTFT", &[1, 1, 2, 2, 2], None),
    ("5L attn-L234 [32,64,256,512,1024]", &[32, 64, 256, 512, 1024], "FFTTT", &[1, 1, 2, 2, 2], None),
    ("5L attn-L1234 [32,64,256,512,1024]", &[32, 64, 256, 512, 1024], "FTTTT", &[1, 1, 2, 2, 2], None),
    ("5L attn-ALL [32,64,256,512,1024]", &[32, 64, 256, 512, 1024], "TTTTT", &[1, 1, 2, 2, 2], None),
    // attention on [64,128,256,512,512] (:483-517)
    ("5L attn-none [64,128,256,512,512]", &[64, 128, 256, 512, 512], "FFFFF", &[1, 1, 2, 2, 2], None),
    ("5L attn-L4 [64,128,256,512,512]", &[64, 128, 256, 512, 512], "FFFFT", &[1, 1, 2, 2, 2], None),
    ("5L attn-L3 [64,128,256,512,512]", &[64, 128, 256, 512, 512], "FFFTF", &[1, 1, 2, 2, 2], None),
    ("5L attn-L234 [64,128,256,512,512]", &[64, 128, 256, 512, 512], "FFTTT", &[1, 1, 2, 2, 2], None),
    ("5L attn-ALL [64,128,256,512,512]", &[64, 128, 256, 512, 512], "TTTTT", &[1, 1, 2, 2, 2], None),
    // attention on [64,128,256,512,1024] (:519-553)
    ("5L attn-none [64,128,256,512,1024]", &[64, 128, 256, 512, 1024], "FFFFF", &[1, 1, 2, 2, 2], None),
    ("5L attn-L4 [64,128,256,512,1024]", &[64, 128, 256, 512, 1024], "FFFFT", &[1, 1, 2, 2, 2], None),
    ("5L attn-L34 [64,128,256,512,1024]", &[64, 128, 256, 512, 1024], "FFFTT", &[1, 1, 2, 2, 2], None),
    ("5L attn-L234 [64,128,256,512,1024]", &[64, 128, 256, 512, 1024], "FFTTT", &[1, 1, 2, 2, 2], None),
    ("5L attn-ALL [64,128,256,512,1024]", &[64, 128, 256, 512, 1024], "TTTTT", &[1, 1, 2, 2, 2], None),
    // head channels (:555-587)
    ("5L heads=32 [32,64,256,512,1024] attn-L34", &[32, 64, 256, 512, 1024], "FFFTT", &[1, 1, 2, 2, 2], Some(32)),
    ("5L heads=64 [32,64,256,512,1024] attn-L34", &[32, 64, 256, 512, 1024], "FFFTT", &[1, 1, 2, 2, 2], Some(64)),
    ("5L heads=32 [64,128,256,512,512] attn-L34", &[64, 128, 256, 512, 512], "FFFTT", &[1, 1, 2, 2, 2], Some(32)),
    ("5L heads=64 [64,128,256,512,512] attn-L34", &[64, 128, 256, 512, 512], "FFFTT", &[1, 1, 2, 2, 2], Some(64)),
    ("5L heads=32 [64,128,256,512,1024] attn-L34", &[64, 128, 256, 512, 1024], "FFFTT", &[1, 1, 2, 2, 2], Some(32)),
];

/// `profile_one`'s head channels and GroupNorm groups where a config names
/// none (`:63-64`).
const DEFAULT_HEADS: u32 = 16;
const NORM_GROUPS: u32 = 16;

fn attention(pattern: &str) -> Vec<bool> {
    pattern.chars().map(|c| c == 'T').collect()
}

/// The files' naming rule (their header): `{levels}L_{widths}_{attention}`,
/// then `_r{res}` where the res blocks are not the level count's usual ones,
/// then `_h{n}` where the script names the head channels.
fn name(widths: &[u32], attn: &[bool], res: &[u32], heads: Option<u32>) -> String {
    let join = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join("-");
    let attention = if attn.iter().all(|a| !a) {
        "no-attn".to_string()
    } else if attn.iter().all(|a| *a) {
        "attn-ALL".to_string()
    } else {
        let levels: String = attn.iter().enumerate().filter(|(_, a)| **a).map(|(l, _)| l.to_string()).collect();
        format!("attn-L{levels}")
    };
    let usual: &[u32] = match widths.len() {
        3 => &[2, 2, 2],
        4 if widths[0] == 64 => &[1, 2, 2, 2],
        4 => &[2, 2, 2, 2],
        _ => &[1, 1, 2, 2, 2],
    };
    let mut n = format!("{}L_{}_{attention}", widths.len(), join(widths));
    if res != usual {
        n += &format!("_r{}", join(res));
    }
    if let Some(h) = heads {
        n += &format!("_h{h}");
    }
    n
}

/// One planned config: name, widths, attention, res blocks, head channels.
type Planned = (String, Vec<u32>, Vec<bool>, Vec<u32>, u32);

/// What a file holding the script's sweep plans: every config in the
/// script's order under its name (a second of one name `__1`), a config
/// identical to an earlier one folded into it (the sweep's collapsed pairs).
fn script_sweep() -> (Vec<Planned>, Vec<(String, String)>) {
    let (mut planned, mut collapsed) = (Vec::<Planned>::new(), Vec::new());
    let mut names = std::collections::HashMap::<String, usize>::new();
    for (_, widths, attn, res, heads) in S2D_SCRIPT {
        let attn = attention(attn);
        assert_eq!((attn.len(), res.len()), (widths.len(), widths.len()), "{widths:?}");
        let mut n = name(widths, &attn, res, *heads);
        let seen = names.entry(n.clone()).or_default();
        if *seen > 0 {
            n += &format!("__{seen}");
        }
        *seen += 1;
        let one = (n, widths.to_vec(), attn, res.to_vec(), heads.unwrap_or(DEFAULT_HEADS));
        match planned.iter().find(|p| (&p.1, &p.2, &p.3, p.4) == (&one.1, &one.2, &one.3, one.4)) {
            Some(kept) => collapsed.push((one.0, kept.0.clone())),
            None => planned.push(one),
        }
    }
    (planned, collapsed)
}

/// Each file is the S2D script's sweep at one of its two shapes (`:649-659`):
/// input (1, 8, 80, H, W), the model seeing image and seg (16 channels) and
/// predicting 8 (`:71-72`); H100 (`IDUN/profiling/profile_s2d_3d.slurm@0ee6133`),
/// batch 1, bf16 autocast, no checkpointing (the script imports none), no
/// `slurm:` settings of its own (the launcher's are the cluster's defaults).
/// `5L attn-L34 [64,128,256,512,1024]` is `5L progressive-wide`'s model and
/// is planned once under the latter's name.
#[test]
fn exp11_exp12_are_the_group_s2d_scripts_config_list() {
    assert_eq!(S2D_SCRIPT.len(), 62, "get_configs() holds 62 configs");
    let (expected, expected_collapsed) = script_sweep();
    assert_eq!(expected.len(), 61);
    assert_eq!(
        expected_collapsed,
        [("5L_64-128-256-512-1024_attn-L34__1".to_string(), "5L_64-128-256-512-1024_attn-L34".to_string())]
    );
    for (file, spatial) in
        [("exp11", [80, 64, 64]), ("exp11_1", [80, 128, 128]), ("exp12", [80, 64, 64]), ("exp12_1", [80, 128, 128])]
    {
        let s = sweep::load(&super::experiments_dir().join(format!("{file}.yaml")), &[]).unwrap();
        assert_eq!(s.experiment.name, file);
        assert_eq!(s.experiment.slurm, Default::default(), "{file}");
        let mut got = Vec::new();
        for c in &s.configs {
            let cfg = &c.config;
            let at = format!("{file}: {}", c.name);
            assert_eq!(cfg.experiment, file, "{at}");
            assert_eq!(
                (cfg.gpu.name(), cfg.precision, cfg.grad_ckpt, cfg.batch),
                ("H100-80GB-HBM3", facts::Precision::Bf16Amp, false, 1),
                "{at}"
            );
            assert_eq!((cfg.input.channels, cfg.out_channels, cfg.input.spatial.dims()), (16, 8, spatial), "{at}");
            let facts::ModelSpec::Unet(u) = &cfg.model else { panic!("{at}: not a UNet") };
            assert_eq!(u.norm_num_groups, NORM_GROUPS, "{at}");
            let heads = u.head_channels();
            assert!(heads.iter().all(|h| *h == heads[0]), "{at}: {heads:?}");
            got.push((c.name.clone(), u.channels.clone(), u.attention_levels.clone(), u.res_blocks(), heads[0]));
        }
        assert_eq!(got, expected, "{file}");
        assert_eq!(s.collapsed, expected_collapsed, "{file}");
    }
    // The wavelet files are the S2D files' configs under their own name.
    for (s2d, wavelet) in [("exp11", "exp12"), ("exp11_1", "exp12_1")] {
        let load = |f: &str| sweep::load(&super::experiments_dir().join(format!("{f}.yaml")), &[]).unwrap();
        let (a, b) = (load(s2d), load(wavelet));
        assert_eq!(a.configs.len(), b.configs.len());
        for (x, y) in a.configs.iter().zip(&b.configs) {
            let mut y = y.config.clone();
            y.experiment = x.config.experiment.clone();
            assert_eq!(x.config, y, "{wavelet}: {}", x.name);
        }
        assert_eq!((a.experiment.gpu, a.experiment.budget_gb), (b.experiment.gpu, b.experiment.budget_gb));
    }
}
