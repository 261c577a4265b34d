//! `backend_cpu::knobs::set` changes a speed setting for the rest of the process, and back: here
//! the int4 tile (`MLLM_CPU_INT4_TILE=f32` keeps rows on a grid off the integer tile), in a test
//! process of its own since the setting holds for every thread.

use backend_cpu::kernels::{self, Grid, Int4Packer, INT4_TILE_ENV};
use backend_cpu::knobs;

#[test]
fn a_set_setting_takes_effect_at_once_and_unset_goes_back_to_the_environment() {
    // This process's environment must not pick the f32 tile itself.
    assert_ne!(std::env::var(INT4_TILE_ENV).as_deref(), Ok("f32"), "run without {INT4_TILE_ENV}=f32");
    let (k, n, block) = (64, 32, 16);
    let mut packer = Int4Packer::new(k, n, block).unwrap();
    packer.push(&(0..k * n).map(|i| (i * 7 % 16) as u8).collect::<Vec<_>>()).unwrap();
    let w = packer.finish(&vec![3u8; n * k / block], &vec![1e-2f32; n]).unwrap();
    let grid = Grid { scale: 1e-3, zero_point: 32768 };
    let x: Vec<f32> = (0..k).map(|i| (i as i32 * 37 % 200 - 100) as f32 * grid.scale).collect();
    let integer = kernels::runs_on_grid(&x, 1, &w, Some(grid));
    let before = kernels::linear_packed_on_grid(&x, 1, &w, None, Some(grid)).unwrap();

    knobs::set(INT4_TILE_ENV, Some("f32")).unwrap();
    assert!(!kernels::runs_on_grid(&x, 1, &w, Some(grid)), "{INT4_TILE_ENV}=f32 set: the f32 tile");
    let f32_tile = kernels::linear_packed_on_grid(&x, 1, &w, None, Some(grid)).unwrap();
    knobs::set(INT4_TILE_ENV, None).unwrap();
    assert_eq!(kernels::runs_on_grid(&x, 1, &w, Some(grid)), integer, "unset: as before");
    assert_eq!(kernels::linear_packed_on_grid(&x, 1, &w, None, Some(grid)).unwrap(), before);
    // A speed setting, not a result: the tiles agree up to f32 rounding order.
    for (a, b) in f32_tile.iter().zip(&before) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} against {b}");
    }

    let err = knobs::set("MLLM_CPU_NOT_A_SETTING", Some("1")).unwrap_err();
    assert!(err.to_string().contains("MLLM_CPU_NOT_A_SETTING"), "{err}");
}
