//! How the server writes a GPU's UUID, as nvidia-smi and MPS's control daemon do
//! (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`): in omps-ctl's answers, the metrics, and
//! where operators name GPUs (memory limits, CUDA_VISIBLE_DEVICES).

pub fn uuid_text(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}
