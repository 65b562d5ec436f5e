// The manifest's JSON Schema for the browser runtime, generated from
// glcomp/format/manifest.schema.json by `python3 -m glcomp.format > glcomp/runtime/js/format/manifest_schema.js`.
// Do not edit: change the JSON and regenerate (a test checks that both agree).
export default {
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$id": "https://glcomp.invalid/manifest.schema.json",
  "title": "glcomp bundle manifest (manifest.json)",
  "description": "The structure of a bundle's manifest. glcomp/format/manifest.py (Python) and glcomp/runtime/js/manifest.js (browser) both validate against this file with the same small interpreter of the keywords used here (glcomp/format/jsonschema.py, glcomp/runtime/js/schema.js), then check in code what a schema cannot say (references resolve, sizes agree, budgets). Patterns are ECMAScript regular expressions, anchored; \"format\": \"state-name\" is a torch name of printable characters, spaces, tabs and newlines (1 to 500); \"number\" means a finite number.",
  "type": "object",
  "properties": {
    "format": {
      "const": "glcomp-bundle"
    },
    "version": {
      "enum": [
        1,
        2,
        3,
        4
      ]
    },
    "target": {
      "$ref": "#/$defs/target"
    },
    "inputs": {
      "type": "object",
      "propertyNames": {
        "$ref": "#/$defs/name"
      },
      "additionalProperties": {
        "$ref": "#/$defs/input"
      }
    },
    "hyper": {
      "type": "object",
      "propertyNames": {
        "$ref": "#/$defs/name"
      },
      "properties": {
        "lr": {
          "type": "number",
          "minimum": 0
        }
      },
      "additionalProperties": {
        "type": "number"
      }
    },
    "states": {
      "type": "object",
      "propertyNames": {
        "$ref": "#/$defs/stateName"
      },
      "additionalProperties": {
        "$ref": "#/$defs/state"
      }
    },
    "counters": {
      "type": "object",
      "propertyNames": {
        "$ref": "#/$defs/stateName"
      },
      "additionalProperties": {
        "type": "integer",
        "minimum": 0,
        "maximum": 1099511627776
      }
    },
    "textures": {
      "type": "object",
      "propertyNames": {
        "$ref": "#/$defs/name"
      },
      "additionalProperties": {
        "$ref": "#/$defs/texture"
      }
    },
    "vertex_shader": {
      "$ref": "#/$defs/shaderFile"
    },
    "programs": {
      "type": "object",
      "propertyNames": {
        "$ref": "#/$defs/name"
      },
      "additionalProperties": {
        "$ref": "#/$defs/program"
      },
      "maxProperties": 4096
    },
    "entries": {
      "type": "object",
      "properties": {
        "predict": {
          "$ref": "#/$defs/entry"
        },
        "gradients": {
          "$ref": "#/$defs/entry"
        },
        "train_step": {
          "$ref": "#/$defs/entry"
        }
      },
      "required": [],
      "additionalProperties": false
    },
    "memory": {
      "type": "object",
      "properties": {
        "texture_bytes": {
          "type": "integer",
          "minimum": 0,
          "maximum": 1099511627776
        },
        "textures": {
          "type": "integer",
          "minimum": 0,
          "maximum": 1099511627776
        }
      },
      "required": [
        "texture_bytes",
        "textures"
      ],
      "additionalProperties": false
    },
    "passes": {
      "type": "object",
      "propertyNames": {
        "type": "string",
        "pattern": "^[a-z][a-z0-9_]{0,40}$"
      },
      "additionalProperties": {
        "type": "boolean"
      }
    },
    "files": {
      "type": "object",
      "propertyNames": {
        "type": "string",
        "pattern": "^(?:weights\\.safetensors|program\\.json|shaders\\.json|shaders/[A-Za-z0-9_]{1,64}\\.(?:frag|vert))$"
      },
      "additionalProperties": {
        "type": "string",
        "pattern": "^[0-9a-f]{64}$"
      }
    }
  },
  "required": [
    "format",
    "version",
    "target",
    "inputs",
    "hyper",
    "states",
    "counters",
    "textures",
    "vertex_shader",
    "programs",
    "entries",
    "memory"
  ],
  "additionalProperties": false,
  "$defs": {
    "name": {
      "type": "string",
      "pattern": "^[A-Za-z0-9_.#-]{1,200}$"
    },
    "stateName": {
      "type": "string",
      "format": "state-name"
    },
    "shaderFile": {
      "type": "string",
      "pattern": "^[A-Za-z0-9_]{1,64}\\.(?:frag|vert)$"
    },
    "uniformName": {
      "type": "string",
      "pattern": "^[a-z][a-z0-9_]{0,40}$"
    },
    "target": {
      "type": "object",
      "properties": {
        "name": {
          "type": "string",
          "minLength": 1,
          "maxLength": 200
        },
        "glsl_version": {
          "enum": [
            "300 es",
            "100"
          ]
        },
        "max_texture_size": {
          "type": "integer",
          "minimum": 1,
          "maximum": 65536
        },
        "max_draw_buffers": {
          "type": "integer",
          "minimum": 1,
          "maximum": 16
        },
        "max_texture_units": {
          "type": "integer",
          "minimum": 1,
          "maximum": 4096
        },
        "max_loop_iterations": {
          "type": "integer",
          "minimum": 0,
          "maximum": 1099511627776
        },
        "float_blend": {
          "type": "boolean"
        }
      },
      "required": [
        "glsl_version",
        "max_texture_size"
      ],
      "additionalProperties": false
    },
    "texture": {
      "type": "object",
      "properties": {
        "width": {
          "type": "integer",
          "minimum": 1,
          "maximum": 65536
        },
        "height": {
          "type": "integer",
          "minimum": 1,
          "maximum": 65536
        },
        "format": {
          "enum": [
            "f32",
            "f16",
            "rgba8"
          ]
        }
      },
      "required": [
        "width",
        "height"
      ],
      "additionalProperties": false
    },
    "shape": {
      "type": "array",
      "items": {
        "type": "integer",
        "minimum": 0,
        "maximum": 1099511627776
      },
      "maxItems": 32
    },
    "layout": {
      "type": "object",
      "properties": {
        "shape": {
          "$ref": "#/$defs/shape"
        },
        "rows": {
          "type": "integer",
          "minimum": 0,
          "maximum": 1099511627776
        },
        "row_len": {
          "type": "integer",
          "minimum": 0,
          "maximum": 1099511627776
        },
        "row_texels": {
          "type": "integer",
          "minimum": 1,
          "maximum": 1099511627776
        },
        "texels": {
          "type": "integer",
          "minimum": 1,
          "maximum": 1099511627776
        },
        "width": {
          "type": "integer",
          "minimum": 1,
          "maximum": 65536
        },
        "height": {
          "type": "integer",
          "minimum": 1,
          "maximum": 65536
        },
        "pages": {
          "type": "integer",
          "minimum": 1,
          "maximum": 1099511627776
        }
      },
      "required": [
        "shape",
        "rows",
        "row_len",
        "row_texels",
        "texels",
        "width",
        "height",
        "pages"
      ],
      "additionalProperties": false
    },
    "state": {
      "type": "object",
      "properties": {
        "layout": {
          "$ref": "#/$defs/layout"
        },
        "role": {
          "enum": [
            "param",
            "buffer",
            "state"
          ]
        },
        "textures": {
          "type": "array",
          "minItems": 2,
          "maxItems": 2,
          "items": {
            "type": "array",
            "items": {
              "$ref": "#/$defs/name"
            }
          }
        }
      },
      "required": [
        "layout",
        "role",
        "textures"
      ],
      "additionalProperties": false
    },
    "input": {
      "type": "object",
      "properties": {
        "shape": {
          "$ref": "#/$defs/shape"
        },
        "layout": {
          "$ref": "#/$defs/layout"
        },
        "dtype": {
          "enum": [
            "float32",
            "int32",
            "int64"
          ]
        },
        "num_classes": {
          "anyOf": [
            {
              "type": "integer",
              "minimum": 1,
              "maximum": 1099511627776
            },
            {
              "type": "null"
            }
          ]
        },
        "image": {
          "description": "an image input: the input's texture holds frames of height x width RGBA pixels (frame n at column (n % columns) * width, row floor(n / columns) * frame_rows, one pixel a texel, each byte as k / 255); runtimes take images for it",
          "type": "object",
          "properties": {
            "batch": {
              "type": "integer",
              "minimum": 1,
              "maximum": 65536
            },
            "height": {
              "type": "integer",
              "minimum": 1,
              "maximum": 65536
            },
            "width": {
              "type": "integer",
              "minimum": 1,
              "maximum": 65536
            },
            "columns": {
              "type": "integer",
              "minimum": 1,
              "maximum": 65536
            },
            "frame_rows": {
              "type": "integer",
              "minimum": 1,
              "maximum": 65536
            },
            "channels": {
              "enum": [
                "rgba"
              ]
            }
          },
          "required": [
            "batch",
            "height",
            "width",
            "columns",
            "frame_rows",
            "channels"
          ],
          "additionalProperties": false
        }
      },
      "required": [
        "shape",
        "layout"
      ],
      "additionalProperties": false
    },
    "program": {
      "type": "object",
      "properties": {
        "fragment": {
          "$ref": "#/$defs/shaderFile"
        },
        "samplers": {
          "type": "array",
          "items": {
            "$ref": "#/$defs/uniformName"
          },
          "maxItems": 4096
        },
        "uniforms": {
          "type": "array",
          "items": {
            "$ref": "#/$defs/uniformName"
          },
          "maxItems": 4096
        },
        "outputs": {
          "type": "integer",
          "minimum": 1,
          "maximum": 16
        },
        "loop_iterations": {
          "type": "integer",
          "minimum": 0,
          "maximum": 1099511627776
        }
      },
      "required": [
        "fragment",
        "samplers",
        "uniforms",
        "outputs",
        "loop_iterations"
      ],
      "additionalProperties": false
    },
    "stateRef": {
      "type": "object",
      "properties": {
        "state": {
          "$ref": "#/$defs/stateName"
        },
        "version": {
          "enum": [
            "cur",
            "next"
          ]
        },
        "page": {
          "type": "integer",
          "minimum": 0,
          "maximum": 1099511627776
        }
      },
      "required": [
        "state",
        "version",
        "page"
      ],
      "additionalProperties": false
    },
    "ref": {
      "anyOf": [
        {
          "$ref": "#/$defs/name"
        },
        {
          "$ref": "#/$defs/stateRef"
        }
      ]
    },
    "entry": {
      "type": "object",
      "properties": {
        "inputs": {
          "type": "object",
          "propertyNames": {
            "$ref": "#/$defs/name"
          },
          "additionalProperties": {
            "type": "array",
            "items": {
              "$ref": "#/$defs/ref"
            }
          }
        },
        "outputs": {
          "type": "object",
          "propertyNames": {
            "$ref": "#/$defs/stateName"
          },
          "additionalProperties": {
            "type": "object",
            "properties": {
              "layout": {
                "$ref": "#/$defs/layout"
              },
              "textures": {
                "type": "array",
                "items": {
                  "$ref": "#/$defs/ref"
                }
              }
            },
            "required": [
              "layout",
              "textures"
            ],
            "additionalProperties": false
          }
        },
        "updates": {
          "type": "array",
          "items": {
            "$ref": "#/$defs/stateName"
          }
        },
        "draws": {
          "type": "array",
          "items": {
            "$ref": "#/$defs/draw"
          }
        }
      },
      "required": [
        "inputs",
        "outputs",
        "draws"
      ],
      "additionalProperties": false
    },
    "draw": {
      "type": "object",
      "properties": {
        "program": {
          "$ref": "#/$defs/name"
        },
        "samplers": {
          "type": "object",
          "propertyNames": {
            "$ref": "#/$defs/uniformName"
          },
          "additionalProperties": {
            "$ref": "#/$defs/ref"
          }
        },
        "uniforms": {
          "type": "object",
          "propertyNames": {
            "$ref": "#/$defs/uniformName"
          },
          "additionalProperties": {
            "$ref": "#/$defs/uniformSource"
          }
        },
        "targets": {
          "type": "array",
          "items": {
            "$ref": "#/$defs/ref"
          },
          "minItems": 1,
          "maxItems": 16
        },
        "viewport": {
          "type": "array",
          "items": {
            "type": "integer",
            "minimum": 1,
            "maximum": 65536
          },
          "minItems": 2,
          "maxItems": 2
        },
        "page_offset": {
          "type": "integer",
          "minimum": 0,
          "maximum": 2147483647
        },
        "blend": {
          "type": "boolean"
        },
        "kernel": {
          "type": "string"
        }
      },
      "required": [
        "program",
        "samplers",
        "uniforms",
        "targets",
        "viewport",
        "page_offset"
      ],
      "additionalProperties": false
    },
    "uniformSource": {
      "type": "object",
      "properties": {
        "hyper": {
          "type": "string"
        },
        "int": {
          "type": "integer",
          "minimum": -16777216,
          "maximum": 16777216
        }
      },
      "required": [],
      "additionalProperties": false,
      "minProperties": 1,
      "maxProperties": 1
    }
  }
};
