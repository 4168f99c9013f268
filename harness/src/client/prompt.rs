//! The body of each streamed request (pure): an OpenAI-compatible completion of a
//! prompt of a drawn number of tokens, asking for a drawn number of output tokens with
//! `ignore_eos`, so every answer is as long as asked (vLLM's random dataset does the
//! same; a server that stops early shows it in the record's `output_tokens`).
//!
//! `/v1/completions` gets the prompt as token ids (the API takes a list of integers),
//! so its length is exact whatever the server's tokenizer; ids are drawn from 1,000 to
//! 29,999, inside the vocabulary of every common decoder (Llama 2's 32,000 tokens,
//! GPT-2's 50,257, Llama 3's 128,256). Chat takes text only: the prompt is a user
//! message of that many short common words, about one token each for the tokenizers
//! above (the server's `usage.prompt_tokens` says exactly, and the record keeps it).

use bytes::Bytes;
use serde_json::json;

use super::SplitMix;
use crate::config::request::{Api, StreamPlan};

/// The ids a prompt's tokens are drawn from.
const IDS: (u32, u32) = (1_000, 29_999);

/// Words a chat prompt is made of, each one token for common tokenizers.
const WORDS: [&str; 16] = [
    "the", "time", "of", "a", "day", "and", "light", "in", "one", "small", "room", "is", "all", "we", "need", "now",
];

/// One request's body and what it asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Body {
    /// The JSON bytes.
    pub bytes: Bytes,
    /// Prompt tokens written.
    pub prompt_len: u32,
    /// `max_tokens` asked.
    pub max_tokens: u32,
}

/// The bodies of one pod's requests, from its seed.
#[derive(Debug, Clone)]
pub struct Bodies {
    plan: StreamPlan,
    rng: SplitMix,
}

impl Bodies {
    /// Bodies for `plan`, their random numbers from `seed` (a pod's seed, so a
    /// recorded seed gives the same requests).
    pub fn new(plan: StreamPlan, seed: u64) -> Self {
        // Apart from the arrival gaps drawn from the same seed.
        Self {
            plan,
            rng: SplitMix::new(seed ^ 0x005E_EDB0_D1E5),
        }
    }

    /// The next request's body.
    pub fn next_body(&mut self) -> Body {
        let p = &self.plan;
        let (prompt_len, max_tokens) = if p.lengths.is_empty() {
            (
                self.rng.between(p.prompt_tokens.low, p.prompt_tokens.high),
                self.rng.between(p.output_tokens.low, p.output_tokens.high),
            )
        } else {
            let [prompt, output] = p.lengths[self.rng.between(0, p.lengths.len() as u32 - 1) as usize];
            (prompt, output)
        };
        let common = json!({
            "model": p.model,
            "max_tokens": max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
            "ignore_eos": true,
            "temperature": 0,
        });
        let mut body = common;
        match p.api {
            Api::Completions => {
                let ids: Vec<u32> = (0..prompt_len).map(|_| self.rng.between(IDS.0, IDS.1)).collect();
                body["prompt"] = json!(ids);
            }
            Api::Chat => {
                let words: Vec<&str> = (0..prompt_len)
                    .map(|_| WORDS[self.rng.between(0, WORDS.len() as u32 - 1) as usize])
                    .collect();
                body["messages"] = json!([{"role": "user", "content": words.join(" ")}]);
            }
        }
        Body {
            bytes: Bytes::from(body.to_string()),
            prompt_len,
            max_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(api: Api, prompt: &str, output: &str) -> StreamPlan {
        StreamPlan {
            api,
            model: "m".into(),
            prompt_tokens: prompt.parse().expect("lengths"),
            output_tokens: output.parse().expect("lengths"),
            lengths: Vec::new(),
            lengths_file: None,
            server_ttft_metric: None,
            server_itl_metric: None,
        }
    }

    fn parsed(b: &Body) -> serde_json::Value {
        serde_json::from_slice(&b.bytes).expect("json")
    }

    #[test]
    fn a_completion_body_holds_the_drawn_ids_and_asks_for_every_token() {
        let mut bodies = Bodies::new(plan(Api::Completions, "16", "8-12"), 7);
        let b = bodies.next_body();
        let v = parsed(&b);
        assert_eq!(b.prompt_len, 16);
        assert!((8..=12).contains(&b.max_tokens));
        let ids = v["prompt"].as_array().expect("ids");
        assert_eq!(ids.len(), 16);
        assert!(ids.iter().all(|i| (1000..30000).contains(&i.as_u64().expect("int"))));
        assert_eq!(v["max_tokens"], b.max_tokens);
        assert_eq!(
            (v["stream"].as_bool(), v["ignore_eos"].as_bool()),
            (Some(true), Some(true))
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "m");
        // The same seed, the same requests; another seed, others.
        let again = Bodies::new(plan(Api::Completions, "16", "8-12"), 7).next_body();
        assert_eq!(again, b);
        assert_ne!(
            Bodies::new(plan(Api::Completions, "16", "8-12"), 8).next_body().bytes,
            b.bytes
        );
    }

    #[test]
    fn a_chat_body_is_one_user_message_of_that_many_words() {
        let b = Bodies::new(plan(Api::Chat, "5", "3"), 1).next_body();
        let v = parsed(&b);
        let text = v["messages"][0]["content"].as_str().expect("content");
        assert_eq!(text.split(' ').count(), 5);
        assert_eq!(v["messages"][0]["role"], "user");
        assert!(v.get("prompt").is_none());
    }

    #[test]
    fn lengths_from_a_trace_are_drawn_pair_by_pair() {
        let mut p = plan(Api::Completions, "1-512", "1-64");
        p.lengths = vec![[512, 64], [8, 1], [100, 20]];
        let mut bodies = Bodies::new(p, 3);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..300 {
            let b = parsed(&bodies.next_body());
            let pair = [
                b["prompt"].as_array().expect("ids").len() as u32,
                b["max_tokens"].as_u64().expect("max_tokens") as u32,
            ];
            assert!([[512, 64], [8, 1], [100, 20]].contains(&pair), "{pair:?}");
            seen.insert(pair);
        }
        assert_eq!(seen.len(), 3, "every pair is drawn");
    }

    #[test]
    fn drawn_lengths_cover_the_range_evenly() {
        let mut bodies = Bodies::new(plan(Api::Completions, "1-4", "1"), 3);
        let mut seen = [0u32; 4];
        for _ in 0..4000 {
            seen[bodies.next_body().prompt_len as usize - 1] += 1;
        }
        // 1000 expected each; 5 standard deviations is ±137.
        assert!(seen.iter().all(|n| (863..=1137).contains(n)), "{seen:?}");
    }
}
