# layers.cmake: the one-way stack of folders (docs/ARCHITECTURE.md), checked on every configure
# and every build. A file may include headers from its own folder and the folders listed for it;
# anything else (an include that points up the stack) stops the build with the file and line.
#   kernels      common types, checked allocation, every CPU kernel, AdamW; kernels/cuda
#   model        configuration, parameters, forward / backward, the CPU and CUDA backends
#   io           whole-file reads, atomic writes, the GGUF container
#   checkpoints  model import (GGUF, safetensors, llm.c), HDF5 router checkpoints
#   data         tokenizer, token shards, text cleaning
#   eval         perplexity, continuation scoring, routing statistics
#   serve        the HTTP server: slots, continuous batching, the OpenAI API
#   train        the training loops (router, mass objective, baselines) and the run settings
#   cli          the focus command line: one file per command
# Run as a script: cmake -DFOCUS_ROOT=<source dir> -P cmake/layers.cmake
if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.22)
endif()
set(FOCUS_LAYERS kernels model io checkpoints data eval serve train cli)
set(FOCUS_ALLOW_kernels kernels)
set(FOCUS_ALLOW_model kernels model)
set(FOCUS_ALLOW_io kernels io)
set(FOCUS_ALLOW_checkpoints kernels model io checkpoints)
set(FOCUS_ALLOW_data kernels io data)
set(FOCUS_ALLOW_serve kernels model io data serve)
set(FOCUS_ALLOW_eval kernels model eval)
set(FOCUS_ALLOW_train kernels model io checkpoints data eval train)
set(FOCUS_ALLOW_cli kernels model io checkpoints data eval serve train cli)

function(focus_check_layers root)
  foreach(layer ${FOCUS_LAYERS})
    file(GLOB_RECURSE files "${root}/${layer}/*.c" "${root}/${layer}/*.h" "${root}/${layer}/*.cu"
         "${root}/${layer}/*.cuh")
    foreach(f ${files})
      file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
      get_filename_component(dir "${f}" DIRECTORY)
      foreach(line ${lines})
        if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"")
          get_filename_component(target "${dir}/${CMAKE_MATCH_1}" ABSOLUTE)
          file(RELATIVE_PATH rel "${root}" "${target}")
          string(REGEX REPLACE "/.*" "" top "${rel}")
          if(NOT top IN_LIST FOCUS_ALLOW_${layer})
            file(RELATIVE_PATH where "${root}" "${f}")
            message(FATAL_ERROR "layers: ${where} includes ${rel}: ${layer}/ may include only "
                                "${FOCUS_ALLOW_${layer}} (docs/ARCHITECTURE.md)")
          endif()
        endif()
      endforeach()
    endforeach()
  endforeach()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)
  focus_check_layers("${FOCUS_ROOT}")
  if(FOCUS_STAMP)
    file(TOUCH "${FOCUS_STAMP}")
  endif()
endif()
