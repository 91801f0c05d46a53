// The name a process serves a model under when none is configured.
#pragma once

#include <string>

namespace pw::service {

// The last component of the model directory ("models/tiny-moe/" -> "tiny-moe").
std::string ModelNameFromDir(const std::string& model_dir);

}  // namespace pw::service
