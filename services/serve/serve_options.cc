#include "services/serve/serve_options.h"

#include <string>
#include <vector>

namespace pw::serve {

void DeclareServeOptions(options::OptionSet* s, ServeOptions* o) {
  s->Add("model_dir", &o->model_dir,
         "checkpoint directory (config.json, model.safetensors or model.safetensors.index.json, "
         "tokenizer.json), or a Hugging Face cache snapshot .../models--ORG--NAME/snapshots/REV")
      .Flag("model_dir").NonEmpty();  // required, but as the argument or in the file: main checks it
  s->Add("memory", &o->memory,
         "memory for the node: bytes (e.g. 8G; K, M, G, T are powers of 1024) or auto (half the "
         "memory available now)")
      .NonEmpty();
  s->Add("host", &o->host, "address every listener binds").NonEmpty();
  s->Add("port", &o->port, "HTTP port of the OpenAI API").Range(1, 65535);
  s->Add("tokenizer", &o->tokenizer,
         "the tokenizer (and chat template) of a checkpoint that ships none: a directory with "
         "tokenizer.json, tokenizer_config.json, chat_template.jinja, or its tokenizer.json");
  s->Add("served_model_name", &o->served_model_name,
         "the model id clients send (default: ORG/NAME of a cache snapshot, else the directory name)");
  s->Add("bits", &o->bits,
         "experts' starting width: auto (the widest the memory allows, at most --max-bits), 3..8, "
         "or 16 (bf16, no store)")
      .OneOf({"auto", "3", "4", "5", "6", "7", "8", "16"});
  s->Add("max_bits", &o->max_bits,
         "the highest width the planner raises experts to: auto (the widest this CPU's "
         "any-precision kernel runs at least as fast as bf16: 8 with AVX-512 VBMI, 5 on AVX2; "
         "never below --bits), or 3..8")
      .OneOf({"auto", "3", "4", "5", "6", "7", "8"});
  s->Add("prefill_bits", &o->prefill_bits,
         "the prefill worker's experts: auto (the store at the node's starting width when this "
         "CPU's any-precision kernel runs it at least as fast as bf16, as for --max-bits; else "
         "the checkpoint's bf16) or 16 (the checkpoint's bf16 always)")
      .OneOf({"auto", "16"});
  s->Add("store_dir", &o->store_dir,
         "cache of any-precision stores (default: $XDG_CACHE_HOME/pagedweight, else ~/.cache/pagedweight)");
  s->Add("run_dir", &o->run_dir, "the node file and per-process logs (default: <store-dir>/run/<model hash>-<port>)");
  s->Add("quantize_threads", &o->quantize_threads, "threads of a store build (0: every core)")
      .Range(0, 1024);
  std::vector<std::string> dense_names = {"auto"};
  for (const auto& [name, f] : DenseFormatChoices()) dense_names.push_back(name);
  s->Add("dense", &o->dense,
         "dense matrices (attention, dense and shared MLPs, lm_head): bf16 as the checkpoint has "
         "them, int8 copies with one scale per row (llama.cpp's q8_0), or ap3..ap8 (any-precision "
         "codes at that many bits, a 2^bits-entry table per row), made by each worker at start "
         "and counted in the memory plan; auto: bf16 with bf16 experts, ap4 (lm_head ap6 where "
         "this CPU's fast path runs 6 bits at speed, else int8) when the experts never exceed 4 "
         "bits (--max-bits 4 or less), int8 otherwise")
      .OneOf(dense_names);
  s->AddChoice("lm_head", &o->lm_head, LmHeadFormatChoices(),
               "the lm_head's own format, one of dense's, or 'dense' (the default): what --dense "
               "gives it (auto's pick, or the same format)");
}

}  // namespace pw::serve
